"""A decode step's grammar masks, computed for every constrained row at once while the step's
forward and log-softmax run, and applied by each row's sampler.

A mask needs the token just chosen. As a logits processor, a grammar read it from the context
mlx-lm hands each processor, a new lazy op: from the second row on it queued behind the whole
forward the first row had started, and the masks were computed one row after another with the
forward done and a core idle. At 8 clients that cost 20-40% of the tokens/s.

Here the grammar is applied by the request's sampler, which mlx-lm calls after its log-softmax
(logprobs over the whole vocabulary: mlx-lm's filters and its categorical draw only need the
ratios of what is left, and a greedy pick only the largest). The sampler also tells the round
which array holds the token it chose, already scheduled at the end of that step: reading it
later waits for it and queues nothing. At the next step the first constrained row's sampler
settles the round for all: the tokens are read at once and consumed, llguidance's executor
computes the masks on a worker thread (it releases the GIL, and so does mlx while it
computes) while this thread has mlx run the forward and the log-softmax (on this CPU a pass
over the vocabulary as long as the forward), and each row's sampler then adds its mask.

A request that asks for logprobs keeps the grammar as a logits processor (its logprobs are
then over what the grammar allows), as do the engines that serve a request at a time.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

import llguidance
import mlx.core as mx
import numpy as np

Sampler = Callable[[mx.array], mx.array]


class Constraint(Protocol):
    """What the round needs of a row's grammar (exod.runner.serving.grammar.Constraint)."""

    matcher: llguidance.LLMatcher
    words: np.ndarray  # the mask's words, as llguidance writes them
    chosen: mx.array | None  # the token its sampler chose, not read yet

    def advance(self, token: int) -> bool: ...

    def filled(self, words: np.ndarray) -> None: ...

    def row(self, logits: mx.array) -> mx.array: ...


class MaskRound:
    """One per engine, used from the thread that steps the batch (the serve loop's)."""

    def __init__(self, threads: int = max(1, (os.cpu_count() or 2) - 1)) -> None:
        # A core is left to mlx's stream, which runs the log-softmax meanwhile on one thread.
        self._chosen: list[Constraint] = []  # rows whose last token is unread, in its `chosen`
        self._masks: Future[None] | None = None
        self._threads = threads
        self._executor: llguidance.LLExecutor | None = None  # made at the first constrained row
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="masks")

    def sampler(self, constraint: Constraint, sampler: Sampler) -> Sampler:
        """`sampler` with `constraint`'s mask added, telling the round what it chose."""
        def choose(logprobs: mx.array) -> mx.array:
            # Each row's sampler is called once a step: a row whose token of the last step
            # is still unread is the first of a new step.
            if constraint.chosen is not None:
                self._settle(logprobs)
            self._join()
            y = constraint.chosen = sampler(logprobs + constraint.row(logprobs))
            self._chosen.append(constraint)
            return y
        return choose

    def forget(self) -> None:
        """The batch was dropped (a failed step): the tokens chosen in it were never emitted."""
        self._join()
        for c in self._chosen:
            c.chosen = None
        self._chosen.clear()

    def _settle(self, logprobs: mx.array) -> None:
        """Every row's token of the last step consumed, and the next masks computed while
        `logprobs` are (a later row's sampler only waits for them)."""
        rows: list[tuple[Constraint, mx.array]] = []
        for c in self._chosen:
            if c.chosen is not None:
                rows.append((c, c.chosen))
                c.chosen = None
        self._chosen = []
        mx.eval([y for _, y in rows])
        tokens = [int(np.asarray(y).reshape(-1)[0]) for _, y in rows]  # no new op: no wait
        live = [c for (c, _), t in zip(rows, tokens, strict=True) if c.advance(int(t))]
        if live:
            self._masks = self._worker.submit(self._fill, live)
        mx.async_eval(logprobs)

    def _join(self) -> None:
        if self._masks is not None:
            masks, self._masks = self._masks, None
            masks.result()

    def _fill(self, rows: list[Constraint]) -> None:
        words = rows[0].words.size
        out = np.zeros((len(rows), words), dtype=np.uint32)
        if self._executor is None:
            self._executor = llguidance.LLExecutor(self._threads)
        self._executor.unsafe_compute_mask_ptr(
            [(c.matcher, i) for i, c in enumerate(rows)], out.ctypes.data, words * 4, len(rows))
        for i, c in enumerate(rows):
            c.filled(out[i])
