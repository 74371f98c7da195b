"""Something to say every few seconds while the serve loop is busy with one long thing between
two steps (reading a request: a chat template and a tokenizer over megabytes take seconds),
so that nobody waiting on this rank takes its silence for a hang or a lost peer.

The tokenizer releases the GIL, so a thread speaks on time. It only runs while the loop's own
thread sends nothing; a call that is over at once never says anything.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType


class Meanwhile:
    def __init__(self, say: Callable[[], object], every: float) -> None:
        self.say = say
        self.every = every
        self.done = threading.Event()
        self.failed: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="exod-meanwhile", daemon=True)

    def __enter__(self) -> Meanwhile:
        self.thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.done.set()
        self.thread.join()
        if self.failed is not None and e is None:
            raise self.failed  # e.g. PeerLost, met by this thread: the caller's to handle

    def _run(self) -> None:
        try:
            while not self.done.wait(self.every):
                self.say()
        except BaseException as e:  # noqa: BLE001 -- raised again in the caller's thread
            self.failed = e
