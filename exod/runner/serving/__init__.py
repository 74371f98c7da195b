"""Serving requests on a loaded rank: the serve loop, the batch engine (continuous batching,
prompt cache, chunked prefill), the turn engine for models that cannot batch, request
preparation and reading, stop sequences and the checks that need the loaded model.
"""
