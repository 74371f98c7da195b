"""The vision engine's sampling and logprobs, in a request's last logits processor.

Sampling is per request although mlx-vlm's generator has one sampler: it samples greedily, and
a request with a temperature draws its token with its own sampler (seed, top-p...) in its last
logits processor, which leaves only that token possible. What a request shows (text, reasoning,
stop sequences, tool calls) comes from exod.runner.serving.output as for text.

Logprobs: the distribution each token was drawn from (after logit_bias, penalties and a
grammar, before the sampler: as mlx-lm's), recorded by the request's last logits processor,
since the one-hot trick above hides it from the generator's own.
"""

from __future__ import annotations

from collections import deque

import mlx.core as mx

from exod.runner.serving.prepare import Processor, Sampler


def last_processor(sampler: Sampler | None, rows: deque[mx.array] | None) -> Processor:
    """A request's last logits processor: records the distribution its token is drawn from
    (`rows`, for its logprobs), and draws the token with the request's own sampler, leaving
    only that one possible for the generator's greedy pick (`sampler` None: greedy, as the
    generator picks)."""

    def process(_tokens: mx.array, logits: mx.array) -> mx.array:
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        if rows is not None:
            rows.append(logprobs)
        if sampler is None:
            return logits
        token = sampler(logprobs)
        chosen = mx.arange(logits.shape[-1]) == token.reshape(-1, 1)
        return mx.where(chosen, mx.zeros_like(logits), mx.full(logits.shape, -mx.inf,
                                                                 dtype=logits.dtype))

    return process
