"""The OpenAI-compatible HTTP API, served by the daemon (aiohttp, in the daemon's event loop).

Only `exod.api.app` imports aiohttp; the other modules are plain Python, so exoctl and the unit
tests can use them without it.
"""
