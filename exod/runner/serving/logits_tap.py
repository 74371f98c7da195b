"""The logits a decode step normalises, caught on their way into mlx-lm's log-softmax, so that
the step's grammar masks can wait for the forward pass alone (exod.runner.serving.mask_round).

Why: on a CPU, a step's forward pass runs its large matmuls on OpenBLAS's threads, one per core,
each with a fixed share of the work. A grammar's masks computed beside them take a core from
one of those threads, and the matmul waits for its slowest share: 1.2 ms of masks cost ~1.2 ms
of the step whatever core they ran on (a spin of that length on the stepping thread cost 14% of
an 8-row step of bench.agent_constrained's model; a sleep of that length, nothing). The
log-softmax over the vocabulary that follows (mlx-lm's `logits - logsumexp(logits)`) runs on
mlx's stream thread alone, with OpenBLAS's threads idle: 5 ms a step for 8 rows of a 49k
vocabulary on that machine, 2.5 ms a row of Qwen's 152k. Masks computed there take a core
nobody needs.

mlx-lm hands the batch sampler only the log-softmax's result, so `mx.logsumexp` is wrapped,
once per runner and only on a CPU (on a GPU the forward pass needs no core, and the masks are
best computed beside all of it): while a step is armed (`arm`, before each
BatchGenerator.next()), the wrapper keeps its last input on this thread. `take` gives it back
when it has the step's shape, else None. Nothing else changes: the wrapper returns mlx's own
result, and what is caught only decides when the stepping thread waits. If mlx-lm ever
normalises otherwise, nothing is caught and the masks are computed beside the forward pass,
as before. EXOD_LOGITS_TAP=0: off.
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
