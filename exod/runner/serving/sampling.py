"""A request's sampler and logits processors, built from mlx-lm's own pieces.

The sampler applies mlx-lm's filters (`apply_top_p`, `apply_min_p`, `apply_top_k`) in the order
`mlx_lm.sample_utils.make_sampler` chains them, then draws from a random key of the request's
own, split once per token. `make_sampler` draws from mlx's process-wide generator instead: in a
batch, one client's seed would then move every other client's draws. Splitting a key is what
that generator does at each draw, so a request with seed S draws exactly the tokens mlx-lm draws
after `mx.random.seed(S)` (tests/integration/test_sampling.py compares them).

Penalties are mlx-lm's processors (`make_logits_processors`), after logit_bias, in its order.
Every number is checked again here by the request rules (exod.core.request_rules), whatever
sent it: nothing reaches mlx unchecked.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable

import mlx.core as mx
from mlx_lm.sample_utils import (apply_min_p, apply_top_k, apply_top_p, greedy_sampler,
                                 make_logits_processors)

from exod.wire import messages as m
from exod.core import request_rules as rules
from exod.runner.serving import model_checks

Sampler = Callable[[mx.array], mx.array]
Processor = Callable[[mx.array, mx.array], mx.array]
Filter = Callable[[mx.array], mx.array]


class KeyedSampler:
    """mlx-lm's filter chain, then a draw from this request's own key (see the module)."""

    def __init__(self, temperature: float, filters: list[Filter], seed: int | None) -> None:
        self.scale = 1.0 / temperature
        self.seeded = seed is not None  # its draws must be mlx-lm's, one a token: no drafts
        self.filters = filters
        self.key = mx.random.key(secrets.randbits(63) if seed is None else seed % (1 << 64))

    def __call__(self, logprobs: mx.array) -> mx.array:
        self.key, sub = mx.random.split(self.key)
        for f in self.filters:
            logprobs = f(logprobs)
        return mx.random.categorical(logprobs * self.scale, key=sub)


def make_request_sampler(req: m.Generate, vocab: int) -> Sampler:
    """Greedy requests share mlx-lm's one greedy sampler, which lets the batch sample them in
    one call; every sampling request gets a KeyedSampler."""
    temperature = rules.number("temperature", req.temperature)
    top_p = rules.number("top_p", req.top_p)
    min_p = rules.number("min_p", req.min_p)
    top_k = rules.top_k(req.top_k)
    # top_p 0 keeps only the most probable token (mlx-lm takes 0 for "off": the opposite).
    if model_checks.greedy_temperature(temperature) or top_p == 0:
        return greedy_sampler
    filters: list[Filter] = []
    if 0 < top_p < 1:
        filters.append(lambda x: apply_top_p(x, top_p))
    if min_p > 0:
        filters.append(lambda x: apply_min_p(x, min_p))
    # top_k at or past the vocabulary keeps every token: no filter (mlx-lm would raise).
    if 0 < top_k < vocab:
        filters.append(lambda x: apply_top_k(x, top_k))
    return KeyedSampler(temperature, filters, req.seed)


def stateless(process: Processor) -> Processor:
    """`process`, marked as a function of its arguments alone (a logit bias, mlx-lm's
    penalties): a speculative step may call it on drafts it then rejects
    (exod.runner.serving.speculative); a grammar or a thinking budget, which keep a state, not."""
    setattr(process, "stateless", True)  # noqa: B010 -- a function's attribute: no type has it
    return process


def penalty_processors(req: m.Generate) -> list[Processor]:
    """repetition, presence and frequency penalties as mlx-lm makes them (none when off)."""
    repetition = rules.repetition_penalty(req.repetition_penalty)
    presence = rules.number("presence_penalty", req.presence_penalty)
    frequency = rules.number("frequency_penalty", req.frequency_penalty)
    sizes = [rules.context_size(name, getattr(req, name)) for name in rules.CONTEXT_SIZES]
    processors: list[Processor] = make_logits_processors(
        repetition_penalty=None if repetition == 1 else repetition,
        repetition_context_size=sizes[0], presence_penalty=presence or None,
        presence_context_size=sizes[1], frequency_penalty=frequency or None,
        frequency_context_size=sizes[2])
    return [stateless(p) for p in processors]
