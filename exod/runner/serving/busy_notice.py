"""Something to say every few seconds while a thread is busy with one long thing (the reader
reading a request: a chat template and a tokenizer over megabytes take seconds), so that the
daemon's hang watch does not take the request's silence for a hang.

One thread per use site, started on first use, asleep on a condition while nothing is being
read (an idle runner never wakes for it). The tokenizer releases the GIL, so the thread speaks
on time. It speaks under the lock the busy thread takes to end the read, so nothing is said
for a read after it is over. A read that is over at once costs two lock round trips and says
nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class Meanwhile:
    def __init__(self, every: float) -> None:
        self.every = every
        self._cond = threading.Condition()
        self._say: Callable[[], object] | None = None
        self._since = 0.0  # when it last spoke, or the read began
        self._read = 0  # reads begun: a new read restarts the clock
        self._failed: BaseException | None = None
        self._thread: threading.Thread | None = None

    @contextmanager
    def busy(self, say: Callable[[], object]) -> Iterator[None]:
        """Run the block; every `every` seconds it lasts, `say()` from the thread. What `say`
        raises (e.g. PeerLost) is raised here once the block is over."""
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="exod-meanwhile",
                                                daemon=True)
                self._thread.start()
            self._say, self._since, self._failed = say, time.monotonic(), None
            self._read += 1
            self._cond.notify()
        try:
            yield
        finally:
            with self._cond:  # waits for a `say` under way
                self._say = None
                failed, self._failed = self._failed, None
                self._cond.notify()
        if failed is not None:
            raise failed

    def _run(self) -> None:
        with self._cond:
            while True:
                while self._say is None:
                    self._cond.wait()
                read = self._read
                while self._say is not None and self._read == read:
                    left = self._since + self.every - time.monotonic()
                    if left > 0:
                        self._cond.wait(left)
                        continue
                    try:
                        self._say()
                    except BaseException as e:  # noqa: BLE001 -- raised again by `busy`
                        self._failed, self._say = e, None
                    self._since = time.monotonic()
