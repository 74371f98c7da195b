"""Any node serves: a request for an instance whose rank 0 runs on another node is sent on to
that node's API as it came (exod.api.proxy.forward), its answer relayed as it comes back."""
