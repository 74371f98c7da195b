"""A thread that runs I/O jobs in order, off the serve loop: the disk tier's writes and reads.

`submit` never waits; it refuses a job when the bytes already queued would pass `max_bytes`
(what waits to be written is memory held beyond the RAM tier's budget), except one job alone:
a job bigger than `max_bytes` is taken when the thread has nothing else, queued or under way.
An agent's prompt is often one KV cache bigger than the RAM tier (Claude Code's ~23k tokens
of an 8B model: ~3 GB, against 1 GiB by default); refused, it was kept nowhere, and every turn
of the session was prefilled whole. Taken alone, at most one entry past the bound is held.
`drain` waits for the queue to empty, up to a deadline (the stop's flush), and `drop` forgets
what has not started.
A job that raises is logged and the next one runs: a disk fault never ends the thread. The
thread is a daemon thread: a runner that exits with a job under way leaves at most a temporary
file, which the next start removes.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

from exod.runner.link.log import ERR, log

Job = Callable[[], None]


class Worker:
    def __init__(self, name: str, max_bytes: int = 1 << 62) -> None:
        self.name = name
        self.max_bytes = max_bytes
        self._jobs: collections.deque[tuple[Job, int]] = collections.deque()
        self._cond = threading.Condition()
        self._queued = 0  # bytes of the jobs not started yet
        self._busy = False
        self._thread: threading.Thread | None = None

    def submit(self, job: Job, nbytes: int = 0) -> bool:
        with self._cond:
            alone = not self._jobs and not self._busy
            if nbytes and self._queued + nbytes > self.max_bytes and not alone:
                return False
            self._jobs.append((job, nbytes))
            self._queued += nbytes
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._cond.notify_all()
        return True

    @property
    def idle(self) -> bool:
        with self._cond:
            return not self._jobs and not self._busy

    def drain(self, deadline: float) -> bool:
        """Wait until every job has run or `deadline` (time.monotonic) passes: whether all ran."""
        with self._cond:
            while self._jobs or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def drop(self) -> int:
        """Forget the jobs not started; how many."""
        with self._cond:
            n = len(self._jobs)
            self._jobs.clear()
            self._queued = 0
            self._cond.notify_all()
        return n

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._jobs:
                    self._busy = False
                    self._cond.notify_all()
                    self._cond.wait()
                job, nbytes = self._jobs.popleft()
                self._queued -= nbytes
                self._busy = True
            try:
                job()
            except Exception as e:  # noqa: BLE001 -- a job's own faults are its log lines
                log(f"{self.name}: {type(e).__name__}: {e}", ERR)
