"""A decode step's grammar masks, computed for every constrained row at once while the step's
forward and log-softmax run (exod.runner.serving.batch_sampler adds them to the logprobs).

A mask needs the token just chosen. As a logits processor, a grammar read it from the context
mlx-lm hands each processor, a new lazy op: from the second row on it queued behind the whole
forward the first row had started, and the masks were computed one row after another with the
forward done and a core idle. At 8 clients that cost 20-40% of the tokens/s.

Here the batch sampler keeps the array of the tokens it chose, already scheduled at the end of
that step: reading it at the next step waits for it and queues nothing. The tokens are consumed
at once, llguidance's executor computes the masks on a worker thread (it releases the GIL, and
so does mlx while it computes), which also lays them out as one matrix to add to the batch's
logprobs, while this thread has mlx run the forward and the log-softmax (on a CPU a pass over
the vocabulary as long as the forward).

The matrix is made from the masks' bytes in one lookup: each byte (8 tokens) picks its 8 floats
(0 allowed, -inf not) from a table of 256 rows: half the CPU of unpacking each row's bits and
choosing between 0 and -inf (`python -m bench grammar_paths`: 0.20 against 0.42 ms for 8 rows of
a 49k vocabulary), and no float row kept per grammar. mlx adds the matrix (on a CPU an addition
costs a twentieth of mlx's `where`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import llguidance
import mlx.core as mx
import numpy as np

Sampler = Callable[[mx.array], mx.array]  # mlx-lm's: logprobs in, tokens out


class Constraint(Protocol):
    """What the round needs of a row's grammar (exod.runner.serving.grammar.Constraint)."""

    matcher: llguidance.LLMatcher
    words: np.ndarray  # the mask's words, as llguidance writes them
    def advance(self, token: int) -> bool: ...

    def filled(self, words: np.ndarray) -> None: ...


class MaskRound:
    """One per engine, used from the thread that steps the batch (the serve loop's)."""

    def __init__(self, threads: int = max(1, (os.cpu_count() or 2) - 1)) -> None:
        # A core is left to mlx's stream, which runs the log-softmax meanwhile on one thread.
        self._threads = threads
        self._executor: llguidance.LLExecutor | None = None  # made at the first constrained row
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="masks")

    def step(self, last: list[tuple[mx.array, list[tuple[int, Constraint]]]],
             rows: list[tuple[int, Constraint]], logprobs: mx.array) -> mx.array | None:
        """The masks of `rows` (by their place in the batch) as a matrix to add to `logprobs`,
        None without a constrained row. `last`: the tokens chosen since, each with the
        constrained rows by their place then: each row consumes its token first."""
        live: list[Constraint] = []
        mx.eval([chosen for chosen, _ in last])
        for chosen, before in last:
            tokens = np.asarray(chosen).reshape(-1)  # no new op: no wait behind the forward
            live += [c for e, c in before if c.advance(int(tokens[e]))]
        if not rows:  # the rows just read are free: the others' masks are still due
            if live:
                self._fill(live, [], logprobs.shape)
            return None
        masks = self._worker.submit(self._fill, live, rows, logprobs.shape)
        mx.async_eval(logprobs)
        return mx.array(masks.result())

    def _fill(self, live: list[Constraint], rows: list[tuple[int, Constraint]],
              shape: tuple[int, ...]) -> np.ndarray:
        if live:
            words = live[0].words.size
            out = np.zeros((len(live), words), dtype=np.uint32)
            if self._executor is None:
                self._executor = llguidance.LLExecutor(self._threads)
            self._executor.unsafe_compute_mask_ptr(
                [(c.matcher, i) for i, c in enumerate(live)], out.ctypes.data, words * 4,
                len(live))
            for i, c in enumerate(live):
                c.filled(out[i])
        return _bias(rows, shape)


# Byte value -> the 8 floats it stands for (bit i: token 8k+i, little-endian as llguidance writes).
_BYTES = np.where(np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1,
                                bitorder="little").astype(np.bool_),
                  np.float32(0), np.float32(-np.inf)).astype(np.float32)


def _bias(rows: list[tuple[int, Constraint]], shape: tuple[int, ...]) -> np.ndarray:
    """The matrix to add: 0 for every token of a free row, and for a constrained row 0 where
    its mask allows the token and -inf elsewhere, padding tokens past its words included (the
    logits of a wider output layer)."""
    n, width = shape[0], shape[-1]
    packed = np.full((n, -(-width // 8)), 0xFF, dtype=np.uint8)
    for e, c in rows:
        mask = c.words.view(np.uint8)[:packed.shape[1]]
        packed[e, :mask.size] = mask
        packed[e, mask.size:] = 0
    out = np.empty((*packed.shape, 8), dtype=np.float32)
    np.take(_BYTES, packed, axis=0, out=out)
    return out.reshape(n, -1)[:, :width]
