"""On a CPU, a model's activation functions computed by every core at once.

mlx's CPU backend runs an elementwise op on one thread, and the transcendental ones are slow
there: erf ~34 ns an element, exp ~18 (x86, mlx 0.32), where an add is under 1. A BERT's GELU
is therefore ~40% of an encoder pass over one input (a MiniLM-shaped model, 48 positions: 12 of
29 ms), computed on one core while the other waits; only OpenBLAS's matmuls used both.

An activation is position-wise, so its rows can be cut into one slice per core, each computed
on a CPU stream of its own (mlx runs each stream on its own thread) and joined again: the same
op on the same elements, so every bit of the result is the one the whole op gives (checked by
tests/integration/test_embeddings.py's comparison with mlx-vlm in process). Only activation
*modules* are wrapped (nn.GELU, nn.SiLU...), found by type in the model's tree: the encoder
families and vision towers use them; mlx-lm's decoders call theirs as functions and keep them.

How many cores a pass may use is set per thread (`Splitter.cores`): where a step already runs
one pass per core (exod.runner.embed.encoder), each pass keeps its activations whole. Small
inputs (under MIN_ELEMENTS) stay whole too: a stream's hand-over costs tens of microseconds.
EXOD_SPLIT=0: off.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import mlx.core as mx
import mlx.nn as nn

# Position-wise activations whose elements cost enough to share out (exp, erf, tanh inside).
ACTIVATIONS: tuple[type[nn.Module], ...] = (
    nn.GELU, nn.SiLU, nn.Sigmoid, nn.Tanh, nn.Mish, nn.Softplus, nn.ELU, nn.CELU, nn.SELU,
    nn.LogSigmoid)
MIN_ELEMENTS = 32_768  # ~1 ms of erf on one core: below it the split gains too little


def enabled() -> bool:
    return mx.default_device() == mx.cpu and os.environ.get("EXOD_SPLIT", "1") != "0"


class Splitter:
    """The streams the slices run on, and the cores this thread's current pass may use."""

    def __init__(self, cores: int) -> None:
        self.streams = [mx.new_stream(mx.cpu) for _ in range(cores)]
        self._local = threading.local()

    def allowed(self) -> int:
        return int(getattr(self._local, "cores", 1))

    @contextmanager
    def cores(self, n: int) -> Iterator[None]:
        """Within: this thread's passes cut activations into (at most) `n` slices."""
        before = self.allowed()
        self._local.cores = min(n, len(self.streams))
        try:
            yield
        finally:
            self._local.cores = before


class SplitRows(nn.Module):
    """An activation module whose input's rows (the next-to-last axis) are cut into a slice
    per allowed core when the input is large enough."""

    def __init__(self, inner: nn.Module, splitter: Splitter) -> None:
        super().__init__()
        self.inner = inner
        self._splitter = splitter  # not a child: kept out of the module tree's parameters

    def __call__(self, x: mx.array) -> mx.array:
        n = self._splitter.allowed()
        rows = x.shape[-2] if x.ndim >= 2 else 0
        if n < 2 or rows < n or x.size < MIN_ELEMENTS:
            return self.inner(x)
        cuts = [rows * i // n for i in range(n + 1)]
        parts = []
        for stream, a, b in zip(self._splitter.streams, cuts, cuts[1:], strict=False):
            with mx.stream(stream):
                parts.append(self.inner(x[..., a:b, :]))
        return mx.concatenate(parts, axis=-2)


def split_activations(model: nn.Module, splitter: Splitter) -> int:
    """Wrap every activation module of `model` (in place); the number wrapped."""
    count = 0

    def wrap(value: Any) -> Any:
        nonlocal count
        if isinstance(value, ACTIVATIONS):
            count += 1
            return SplitRows(value, splitter)
        return value

    def visit(_: str, module: nn.Module) -> None:
        if isinstance(module, SplitRows):
            return
        for key, value in list(module.items()):
            if isinstance(value, list):
                module[key] = [wrap(v) for v in value]
            elif isinstance(value, ACTIVATIONS):
                module[key] = wrap(value)

    model.apply_to_modules(visit)
    return count
