"""A row taken out of mlx-lm's BatchGenerator between two steps and put back later, its request
whole (exod.runner.serving.fair_share decides whom: `batch` work when interactive work waits).

A row still in its prompt leaves with its cache and the prompt tokens it holds; it comes back
from that cache with the rest of its prompt, as a prompt cache hit does. A row being decoded
has already chosen its next token (mlx-lm samples a step ahead): that token is taken too, to be
sent now as the row's next one, and the row comes back from its cache fed that token, as if it
had never left. So nothing is sampled twice (a seeded draw, a grammar's state, a penalty's
context see the same tokens in the same order) and the request's tokens are its own.
Reads mlx-lm 0.32's private fields (as exod.runner.serving.batch_sampler does); where they are
not there, `can_hold` says so and the engine holds nothing back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class HeldBack:
    cache: list[Any] | None  # None: it held nothing yet
    tokens: list[int]  # what the cache holds
    feed: list[int]  # what goes in when it comes back: the rest of the prompt, or its next token


@dataclass
class Ahead:
    """The token a row being decoded had chosen, as mlx-lm's GenerationBatch.Response."""

    uid: int
    token: int
    logprobs: Any
    finish_reason: str | None
    prompt_cache: list[Any] | None
    all_tokens: list[int] | None


def can_hold(gen: Any) -> bool:
    try:
        batch = gen._generation_batch
        return isinstance(batch.uids, list) and hasattr(batch, "_next_tokens") \
            and hasattr(batch, "_next_logprobs") and hasattr(gen, "extract_cache")
    except AttributeError:
        return False


def take_out(gen: Any, uid: int, prompt: list[int]) -> tuple[HeldBack, tuple[int, Any] | None]:
    """Row `uid` out of `gen`: what brings it back, and for a row being decoded the token it
    chose and that token's logprobs (None: still in its prompt)."""
    decoding = gen._generation_batch.uids
    ahead = None
    if uid in decoding:
        i = decoding.index(uid)
        ahead = (int(gen._generation_batch._next_tokens[i].item()),
                 gen._generation_batch._next_logprobs[i])
    (cache, tokens), = gen.extract_cache([uid]).values()
    gen.remove([uid])
    tokens = list(tokens)
    if ahead is not None:
        return HeldBack(cache, tokens, [ahead[0]]), ahead
    return HeldBack(cache if tokens else None, tokens, prompt[len(tokens):]), None
