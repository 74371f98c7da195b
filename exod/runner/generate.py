"""One generation request in the runner, read from its `generate` message: prompt tokens (chat
template or raw text), a sampler of its own, logit bias, stop sequences.

Both engines (exod.runner.engine for one rank, exod.runner.sequential for groups) build their
requests from here, so a request means the same thing whichever engine serves it.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

import mlx.core as mx
from mlx_lm.sample_utils import apply_top_p, greedy_sampler, make_logits_processors

from exod.protocol import Message

Sampler = Callable[[mx.array], mx.array]
Processor = Callable[[mx.array, mx.array], mx.array]


class RequestError(Exception):
    """The request cannot be served as given (e.g. an empty prompt)."""


def chat_prompt(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    if getattr(tokenizer, "has_chat_template", True):
        tokens = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        return [int(t) for t in tokens]
    # No template in the model: plain "role: content" lines, then the assistant's turn.
    text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
    return list(tokenizer.encode(text))


def prompt_tokens(tokenizer: Any, req: Message) -> list[int]:
    if req.get("kind") == "chat":
        try:
            tokens = chat_prompt(tokenizer, list(req.get("messages") or []))
        except Exception as e:  # noqa: BLE001 -- e.g. a chat template that rejects the roles
            raise RequestError(f"{type(e).__name__}: {e}") from e
    else:
        text = str(req.get("prompt") or "")
        # BOS as the model wants it, unless the text already starts with it (as mlx-lm does).
        bos = getattr(tokenizer, "bos_token", None)
        tokens = list(tokenizer.encode(text, add_special_tokens=bos is None
                                       or not text.startswith(bos))) if text else []
    if not tokens:
        raise RequestError("the prompt is empty")
    return [int(t) for t in tokens]


def vocab_size(model: Any, tokenizer: Any) -> int:
    """Rows of the logits: the model's vocabulary (the tokenizer's may be smaller)."""
    # parallel.LeaderModel (rank 0 of a group) stands in for the model and knows it as `vocab`.
    n = getattr(getattr(model, "args", None), "vocab_size", getattr(model, "vocab", None))
    return int(n) if isinstance(n, int) and n > 0 else len(tokenizer)


def bias_processors(bias: Any, vocab: int) -> list[Processor]:
    """logit_bias as a logits processor. Ids are checked here too, not only by the API: an
    out-of-range index in `logits.at[...]` writes outside the array."""
    if not bias:
        return []
    out: dict[int, float] = {}
    for k, v in dict(bias).items():
        try:
            tid = int(k)
        except (TypeError, ValueError):
            raise RequestError(f"logit_bias: {k!r} is not a token id") from None
        if not 0 <= tid < vocab:
            raise RequestError(f"logit_bias: token id {tid} is outside the vocabulary "
                               f"(0 to {vocab - 1})")
        out[tid] = float(v)
    return list(make_logits_processors(logit_bias=out))


class KeyedSampler:
    """Temperature / top-p sampling from a random key of this request's own, split once per
    token. A seed then reproduces the request whatever else runs beside it: nothing reseeds
    the process-wide generator, so one client's seed never touches another's draws."""

    def __init__(self, temperature: float, top_p: float, seed: int | None) -> None:
        self.scale = 1.0 / temperature
        self.top_p = top_p
        self.key = mx.random.key(secrets.randbits(63) if seed is None else seed % (1 << 64))

    def __call__(self, logprobs: mx.array) -> mx.array:
        self.key, sub = mx.random.split(self.key)
        if 0 < self.top_p < 1:
            logprobs = apply_top_p(logprobs, self.top_p)
        return mx.random.categorical(logprobs * self.scale, key=sub)


def make_request_sampler(req: Message) -> Sampler:
    """Greedy requests share mlx-lm's one greedy sampler, which lets the batch sample them in
    one call; every sampling request gets a KeyedSampler."""
    temperature = float(req.get("temperature", 1.0))
    if temperature <= 0:
        return greedy_sampler
    seed = req.get("seed")
    return KeyedSampler(temperature, float(req.get("top_p", 1.0)),
                        int(seed) if seed is not None else None)
