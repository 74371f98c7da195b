"""One sampler for the whole batch: each row's own (greedy, or its request's seeded sampler) after
its grammar's mask, the masks of a step's constrained rows computed at once
(exod.runner.serving.mask_round).

Why one: mlx-lm's BatchGenerator samples the batch in one call when every row has the same
sampler object, and row by row otherwise (a slice, the sampler's ops and a concatenation per
row, on the thread that steps the batch). Every row of the engine gets this object; it knows
the rows by their uid, in the generator's order, and does per row only what differs: a mask
applied where a row has a grammar (one pass for the whole batch), a row's own draw where its
request samples. A batch of greedy rows, constrained or not, is one argmax.

The mask is applied to mlx-lm's logprobs, after its log-softmax over the whole vocabulary:
greedy picks the largest, and mlx-lm's filters (top-p, min-p, top-k) and its categorical draw
only need the ratios of what is left. A request that asks for logprobs keeps its grammar as a
logits processor instead, so that its logprobs are over what the grammar allows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.sample_utils import greedy_sampler

from exod.runner.serving import logits_tap
from exod.runner.serving.mask_round import Constraint, MaskRound, Sampler

Order = Callable[[], Sequence[int]]  # uids, in a batch's order


@dataclass(frozen=True)
class Rows:
    """Where mlx-lm's BatchGenerator keeps its rows (private fields of mlx-lm 0.32)."""

    decoding: Order  # the batch being decoded, in its order
    reading: Order  # the prompts being read, and those not started yet


@dataclass(frozen=True)
class _Row:
    sampler: Sampler
    grammar: Constraint | None


def generator_rows(gen: Any) -> Rows | None:
    """`gen`'s rows, or None where they are not where mlx-lm 0.32 keeps them: the engine then
    gives each row its own sampler and its grammar as a processor."""
    try:
        for uids in (gen._generation_batch.uids, gen._prompt_batch.uids):
            assert isinstance(uids, list)
        assert all(isinstance(seq[0], int) for seq in gen._unprocessed_sequences)
    except (AttributeError, AssertionError, IndexError, TypeError):
        return None
    return Rows(lambda: gen._generation_batch.uids,
                lambda: [*gen._prompt_batch.uids, *(seq[0] for seq in gen._unprocessed_sequences)])


class BatchSampler:
    """Called by mlx-lm once a step for the batch being decoded, and once more for the rows
    whose prompt was read in that step (their first token, before they join the batch)."""

    def __init__(self, masks: MaskRound, rows: Rows) -> None:
        self._masks = masks
        self._where = rows
        self._rows: dict[int, _Row] = {}
        self._sampled: set[int] = set()  # rows sampled before: never among those just read
        self._decoding_next = False
        # The tokens chosen since the last call, and the constrained rows by their place then.
        self._last: list[tuple[mx.array, list[tuple[int, Constraint]]]] = []
        self.calls = 0  # batches sampled here (a check that mlx-lm takes this path)
        logits_tap.install()  # on a CPU: the masks wait for the forward pass, not beside it

    def add(self, uid: int, sampler: Sampler = greedy_sampler,
            grammar: Constraint | None = None) -> None:
        self._rows[uid] = _Row(sampler, grammar)

    def own(self, uid: int) -> tuple[Sampler, Constraint | None]:
        """A row's own sampler and grammar (a speculative step samples its later positions
        with the sampler itself: exod.runner.serving.speculative)."""
        row = self._rows.get(uid)
        return (row.sampler, row.grammar) if row is not None else (greedy_sampler, None)

    def drop(self, uid: int) -> None:
        self._rows.pop(uid, None)
        self._sampled.discard(uid)

    def begin(self) -> None:
        """Before each BatchGenerator.next(): its first call here samples the batch being
        decoded, when there is one; a later call, the rows whose prompt it has just read."""
        self._decoding_next = bool(self._where.decoding())
        logits_tap.arm()

    def _uids(self, n: int) -> list[int]:
        if self._decoding_next:
            self._decoding_next = False
            uids = list(self._where.decoding())
        else:  # in no batch yet, in the order they came (rows that ended in this step have
            # left the batch too, before the engine drops them: they were sampled before)
            known = self._sampled | set(self._where.decoding()) | set(self._where.reading())
            uids = sorted(uid for uid in self._rows if uid not in known)
        if len(uids) != n:  # every row must have this sampler (see the engine)
            raise RuntimeError(f"the batch sampler got {n} rows for {len(uids)}")
        return uids

    def __call__(self, logprobs: mx.array) -> mx.array:
        uids = self._uids(logprobs.shape[0])
        self._sampled.update(uids)
        self.calls += 1
        rows = [self._rows.get(uid) or _Row(greedy_sampler, None) for uid in uids]
        constrained = [(e, r.grammar) for e, r in enumerate(rows) if r.grammar is not None]
        last, self._last = self._last, []
        logits = logits_tap.take(logprobs.shape)
        if constrained or last:
            logprobs = self._masks.apply(last, constrained, logprobs, logits)
        if all(r.sampler is greedy_sampler for r in rows):
            chosen = greedy_sampler(logprobs)
        else:
            chosen = mx.concatenate([r.sampler(logprobs[e:e + 1]) for e, r in enumerate(rows)])
        if constrained:
            self._last.append((chosen, constrained))
        return chosen
