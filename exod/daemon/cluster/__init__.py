"""Discovery: the exods that hold one cluster key find each other (docs/cluster.md).

`discovery` owns the node table (exod.core.membership) and every exchange; `finders` is the
transport seam that says where other nodes may be (mDNS in `mdns`, seed addresses); `endpoint`
answers peers; `exchange` asks them; `self_node` measures what this node announces.
"""
