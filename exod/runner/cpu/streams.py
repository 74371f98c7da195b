"""The CPU streams a runner cuts work across (exod.runner.cpu.split's activations,
exod.runner.cpu.attention's heads), one per core, and how many of them the work on each thread
may use: a thread that runs a model alone may use them all; where a step already runs a pass
per core (the embedding encoder's parts), each pass uses one."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import mlx.core as mx


class ActivationSplitter:
    """The streams the slices run on, and the cores this thread's current pass may use."""

    def __init__(self, cores: int) -> None:
        self.streams = [mx.new_stream(mx.cpu) for _ in range(cores)]
        self._local = threading.local()

    def allowed(self) -> int:
        return int(getattr(self._local, "cores", 1))

    def allow(self, n: int) -> None:
        """From now on, this thread's passes cut activations into (at most) `n` slices."""
        self._local.cores = min(n, len(self.streams))

    @contextmanager
    def cores(self, n: int) -> Iterator[None]:
        """Within: this thread's passes cut activations into (at most) `n` slices."""
        before = self.allowed()
        self.allow(n)
        try:
            yield
        finally:
            self._local.cores = before
