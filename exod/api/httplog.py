"""aiohttp's own log (stdlib logging), routed into exod's log: one line per cause and interval,
no traceback. A malformed request or a reset connection is the client's problem, logged at
debug level; anything else aiohttp reports (an exception in a handler) is an error of exod's,
still rate-limited.
Without this, every malformed request printed a full traceback on stderr.
"""

from __future__ import annotations

import logging

from aiohttp.http_exceptions import HttpProcessingError

from exod.daemon.ratelog import RateLimitedLog


class _Forward(logging.Handler):
    def __init__(self, log: RateLimitedLog) -> None:
        super().__init__()
        self.log = log

    def emit(self, record: logging.LogRecord) -> None:
        exc = record.exc_info[1] if record.exc_info else None
        text = record.getMessage()
        if exc is not None:
            first = str(exc).strip().splitlines()
            text += f": {type(exc).__name__}" + (f": {first[0]}" if first else "")
        # A peer that resets or closes mid-answer (ConnectionResetError, BrokenPipeError) is the
        # client's doing too: the handler's generation is cancelled like any disconnect's.
        client_fault = isinstance(exc, (HttpProcessingError, ConnectionError)) \
            or record.levelno < logging.ERROR
        level = "DEBUG" if client_fault else "ERROR"
        self.log.log(level, f"http:{level}:{type(exc).__name__}", "HTTP API: {}", text)


def quiet_logger(log: RateLimitedLog) -> logging.Logger:
    """The logger to hand aiohttp's server (RequestHandler's `logger`)."""
    logger = logging.getLogger("exod.api.aiohttp")
    logger.handlers[:] = [_Forward(log)]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    return logger
