"""Contiguous layer ranges for the ranks of a pipeline, each sized by the room it has.

A rank has a room (bytes), a fixed need (its runtime, the ends of the model it holds) and a cost
for each layer (weights and KV reserve, as its node runs them). A split fits when each rank's
fixed need and its layers are within its room, every rank holding at least one layer. Of the
splits that fit, the one chosen balances the ranks: each one's need as nearly in proportion to
its room as whole layers allow (the least sum of need² / room), so a node with twice the room
holds about twice the bytes; between equal splits, the earlier ranks hold fewer layers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate


@dataclass(frozen=True)
class RankRoom:
    room: int  # what the rank may use
    fixed: int  # what it needs whatever its layers
    layers: tuple[int, ...]  # what each layer of the model costs it

    def need(self, start: int, end: int) -> int:
        return self.fixed + sum(self.layers[start:end])


def spans(counts: Sequence[int]) -> list[tuple[int, int]]:
    """[start, end) of each rank, from its layer count."""
    ends = list(accumulate(counts))
    return list(zip([0, *ends[:-1]], ends, strict=True))


def fits(ranks: Sequence[RankRoom], counts: Sequence[int]) -> bool:
    return all(n >= 1 and r.need(s, e) <= r.room
               for r, n, (s, e) in zip(ranks, counts, spans(counts), strict=True))


def can_fit(ranks: Sequence[RankRoom]) -> bool:
    """Whether any split fits (which layer each rank can end at, rank after rank: cheaper than
    `balanced`, which weighs every split that fits)."""
    total = len(ranks[0].layers) if ranks else 0
    if not ranks or len(ranks) > total:
        return False
    ends = {0}
    for r, rank in enumerate(ranks):
        last_end = total - (len(ranks) - 1 - r)
        reached: set[int] = set()
        for start in sorted(ends):
            used = rank.fixed
            for end in range(start + 1, last_end + 1):
                used += rank.layers[end - 1]
                if used > rank.room:
                    break
                reached.add(end)
        ends = reached
    return total in ends


def balanced(ranks: Sequence[RankRoom], strict: bool = True) -> tuple[int, ...] | None:
    """The balanced split (see the module), or None when none fits. `strict=False`: the same
    balance whether or not the ranks' rooms hold it (what a refusal shows)."""
    k = len(ranks)
    total = len(ranks[0].layers) if ranks else 0
    if k == 0 or k > total:
        return None
    prefix = [list(accumulate(r.layers, initial=0)) for r in ranks]
    inf = float("inf")
    # best[i]: the least cost of ranks r.. holding layers i..; choice[r][i]: rank r's end.
    best = [inf] * (total + 1)
    best[total] = 0.0
    choice: list[list[int]] = [[0] * (total + 1) for _ in range(k)]
    for r in range(k - 1, -1, -1):
        room = max(ranks[r].room, 1)
        after = [inf] * (total + 1)
        last_end = total if r == k - 1 else total - (k - 1 - r)
        for i in range(r, last_end):
            for j in range(i + 1, last_end + 1) if r < k - 1 else (total,):
                need = ranks[r].fixed + prefix[r][j] - prefix[r][i]
                if strict and need > ranks[r].room:
                    break
                cost = need * need / room + best[j]
                if cost < after[i]:
                    after[i], choice[r][i] = cost, j
        best = after
    if best[0] == inf:
        return None
    counts, start = [], 0
    for r in range(k):
        end = choice[r][start]
        counts.append(end - start)
        start = end
    return tuple(counts)
