"""Serving requests on a loaded rank: the serve loop, the batch engine (continuous batching,
prompt cache, chunked prefill), the turn engine for models that cannot batch, request
preparation and reading, stop sequences, and what the loaded model says for the request rules
(exod.core.request_rules) to check against: its logits width and its context window.
"""
