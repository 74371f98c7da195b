"""The logits a decode step normalises, caught on their way into mlx-lm's log-softmax, so that
the step's grammar masks can wait for the forward pass alone (exod.runner.serving.mask_round).

Why: on a CPU, a forward pass runs its large matmuls on OpenBLAS's threads, one per core, each
with a fixed share of the work, and a matmul waits for its slowest share: masks computed beside
it take a core from one of those threads and lengthen the step by about their own time. The
log-softmax that follows (mlx-lm's `logits - logsumexp(logits)`) runs on mlx's stream thread
alone, with OpenBLAS's threads idle: masks computed then take a core nobody needs (measured:
docs/design/constrained-decoding.md).

mlx-lm hands the batch sampler only the log-softmax's result, so `mx.logsumexp` is wrapped, once
per runner and only on a CPU (on a GPU the forward needs no core): while a step is armed (`arm`),
the wrapper keeps its last input on this thread, and `take` gives it back when it has the
step's shape. It returns mlx's own result: what is caught only decides when the stepping thread
waits (if mlx-lm normalises otherwise, the masks go beside the forward). EXOD_LOGITS_TAP=0: off.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import mlx.core as mx

_stock: Any = None  # mlx's logsumexp, once wrapped
_here = threading.local()  # .armed: a step is being built; .logits: what it normalised


def install() -> bool:
    """Wrap mx.logsumexp on a CPU (idempotent); True if wrapped."""
    global _stock
    if _stock is not None:
        return True
    if mx.default_device() != mx.cpu or os.environ.get("EXOD_LOGITS_TAP", "1") == "0":
        return False
    _stock = mx.logsumexp

    def logsumexp(a: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(_here, "armed", False):
            _here.logits = a
        return _stock(a, *args, **kwargs)

    mx.logsumexp = logsumexp
    return True


def uninstall() -> None:
    """mlx's own logsumexp back (tests)."""
    global _stock
    if _stock is not None:
        mx.logsumexp = _stock
        _stock = None


def arm() -> None:
    """A step is about to be built on this thread: catch what it normalises."""
    _here.armed = _stock is not None
    _here.logits = None


def take(shape: tuple[int, ...]) -> mx.array | None:
    """What the step normalised last, if it is an array of `shape` (the logprobs'); once."""
    logits, _here.logits = getattr(_here, "logits", None), None
    if isinstance(logits, mx.array) and tuple(logits.shape) == tuple(shape):
        return logits
    return None
