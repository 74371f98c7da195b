"""What one row of a speculative step emits: mlx-lm's rule (speculative_generate_step), row by
row. The model sampled a token at each of the k+1 positions it read (the row's last token, then
the k draft tokens); a draft token is kept while it equals the model's token at its place, and
the model's token after the last one kept ends the row's step. Each token emitted is the model's
own sample given the tokens before it, so greedy rows get the model's greedy tokens and sampling
rows its distribution. Pure: no mlx."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

FRESH = -1  # the position of a row's first token, sampled when its prompt was read

# A token emitted, in order: whether it ends the request ("stop", "length") or None.
Finish = Callable[[int], "str | None"]


@dataclass(frozen=True)
class Kept:
    tokens: list[int]  # emitted, in order
    positions: list[int]  # of each, the position of the model's logits it was sampled at
    finish: str | None  # the last token ended the request
    keep: int  # of the k+1 tokens the model read this step, those its cache keeps
    accepted: int  # draft tokens emitted


def agreed(drafts: Sequence[int], samples: Sequence[int]) -> int:
    """Leading draft tokens equal to the model's token at their place."""
    n = 0
    while n < len(drafts) and drafts[n] == samples[n]:
        n += 1
    return n


def judge(drafts: Sequence[int], samples: Sequence[int], *, speculates: bool, fresh: int | None,
          finish: Finish) -> Kept:
    """One row: `samples` (k+1) the model's tokens, `drafts` (k) the draft's; a row that does
    not speculate keeps none of them. `fresh`: its first token, not emitted yet. `finish` is
    called on each token emitted, in order, and the row stops at the first that ends it.
    The model's cache keeps the tokens it read before the last one emitted: the last one is
    read at the next step, as mlx-lm's batch reads a token after emitting it."""
    n = agreed(drafts, samples) if speculates else 0
    out: list[tuple[int, int]] = [] if fresh is None else [(fresh, FRESH)]
    out += [(samples[i], i) for i in range(n + 1)]  # drafts[i] == samples[i] for i < n
    tokens: list[int] = []
    positions: list[int] = []
    reason = None
    for token, at in out:
        tokens.append(token)
        positions.append(at)
        reason = finish(token)
        if reason is not None:
            break
    last = positions[-1]
    accepted = sum(1 for at in positions if 0 <= at < n)
    return Kept(tokens, positions, reason, keep=last + 1, accepted=accepted)
