"""Log lines rate-limited per cause: under attack (a flood of bad connections, fd exhaustion)
the same complaint would otherwise be logged thousands of times a second and fill the disk.
The first occurrence is logged at once; later ones within `interval` are counted, and the count
is reported with the next line of that cause.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from loguru import logger

INTERVAL = 10.0


class RateLimitedLog:
    def __init__(self, interval: float = INTERVAL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self.clock = clock
        self._next: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def allow(self, cause: str) -> int | None:
        """None while `cause` is muted (counted); else how many were muted since last time."""
        now = self.clock()
        if now < self._next.get(cause, 0.0):
            self._held[cause] = self._held.get(cause, 0) + 1
            return None
        self._next[cause] = now + self.interval
        return self._held.pop(cause, 0)

    def log(self, level: str, cause: str, message: str, *args: Any,
            exception: BaseException | None = None) -> bool:
        held = self.allow(cause)
        if held is None:
            return False
        text = message.format(*args) if args else message
        if held:
            text += f" ({held} more like it in the last {self.interval:g}s)"
        logger.opt(exception=exception).log(level, "{}", text)
        return True

    def warning(self, cause: str, message: str, *args: Any) -> bool:
        return self.log("WARNING", cause, message, *args)

    def error(self, cause: str, message: str, *args: Any) -> bool:
        return self.log("ERROR", cause, message, *args)


def install_loop_handler(loop: asyncio.AbstractEventLoop, log: RateLimitedLog) -> None:
    """asyncio reports e.g. every failed accept() (EMFILE: out of file descriptors) through the
    loop's exception handler, with a traceback each time; here once per cause and interval,
    without the traceback. asyncio itself backs off the listening socket for a second."""

    def handle(_loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        message = str(context.get("message") or "event loop error")
        cause = f"loop:{message}:{type(exc).__name__ if exc else ''}"
        detail = f": {type(exc).__name__}: {exc}" if exc is not None else ""
        log.error(cause, "{}{}", message, detail)

    loop.set_exception_handler(handle)
