"""Models named by hub repository: fetched into huggingface_hub's cache by a supervised process.

`ref` parses names, `cache` reads the cache layout (pure file system, no huggingface_hub, so
the daemon can use it), `verify` checks files against the hub's hashes, and `fetch` (run as
`python -m exod.hub`, the only place huggingface_hub is imported) downloads.
"""
