"""Per-instance admission: at most `limit` requests at the runner, at most `queue` waiting.

A request beyond both is refused at once (429), never parked without bound. Waiters are served
in arrival order: a finishing request hands its slot straight to the oldest waiter. A waiter
whose client goes away (its task is cancelled) leaves the queue, or passes on a slot it was
just handed. `reject_waiting` fails every waiter at once (the instance stopped being ready).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable


class QueueFull(Exception):
    pass


class Gate:
    def __init__(self, limit: int, queue: int) -> None:
        self.limit = limit
        self.queue = queue
        self.active = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    @property
    def waiting(self) -> int:
        return sum(1 for f in self._waiters if not f.done())

    async def enter(self) -> None:
        """Take a slot, waiting for one if needed; raises QueueFull when the queue is full,
        or whatever `reject_waiting` set."""
        if self.active < self.limit and not self._waiters:
            self.active += 1
            return
        if len(self._waiters) >= self.queue:
            raise QueueFull()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut  # resolved by leave(), which hands its slot over (active unchanged)
        except asyncio.CancelledError:
            if fut in self._waiters:
                self._waiters.remove(fut)
            elif fut.done() and not fut.cancelled() and fut.exception() is None:
                self.leave()  # the slot came just as the client left: pass it on
            raise

    def resize(self, limit: int, queue: int | None = None) -> None:
        """A new width (set by memory admission at a start, or the runner's engine taking the
        queue: exod.daemon.lane): waiters take the new slots. A smaller one takes effect as
        requests leave; waiters past a smaller queue stay (they were let in)."""
        self.limit = limit
        if queue is not None:
            self.queue = queue
        while self.active < self.limit and self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                self.active += 1
                fut.set_result(None)

    def leave(self) -> None:
        if self.active > self.limit:  # narrowed meanwhile: the slot goes, to nobody
            self.active -= 1
            return
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self.active -= 1

    def reject_waiting(self, make_error: Callable[[], BaseException]) -> None:
        waiters, self._waiters = self._waiters, collections.deque()
        for fut in waiters:
            if not fut.done():
                fut.set_exception(make_error())
