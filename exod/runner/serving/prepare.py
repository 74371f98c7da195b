"""One generation request in the runner, read from its `generate` message: prompt tokens (chat
template or raw text), a sampler of its own, logit bias, stop sequences. Every field is checked
again here by the request rules (exod.core.request_rules), with the numbers of the model as
loaded (exod.runner.serving.model_checks), whatever sent it: nothing reaches mlx unchecked.

The engine (exod.runner.serving.batch_engine.BatchEngine, on every rank of a group too) builds its
requests from here.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.sample_utils import apply_top_p, greedy_sampler

from exod import messages as m
from exod.core import request_rules as rules
from exod.core.request_rules import RequestError
from exod.runner.serving import model_checks, tool_calls
from exod.runner.serving.grammar import Constraint, Grammars
from exod.runner.serving.reading import Prompt

__all__ = ["Checked", "read_prompt", "check_request", "prompt_tokens",
           "bias_processors", "context_window", "make_request_sampler", "vocab_size"]

context_window = model_checks.context_window

Sampler = Callable[[mx.array], mx.array]
Processor = Callable[[mx.array, mx.array], mx.array]


def chat_prompt(tokenizer: Any, messages: list[dict[str, Any]],
                tools: list[dict[str, Any]] | None = None) -> list[int]:
    if getattr(tokenizer, "has_chat_template", True):
        # The tools go to the model's own template, which knows how the model wants them.
        tokens = tokenizer.apply_chat_template(messages, tools=tools or None,
                                               add_generation_prompt=True)
        return [int(t) for t in tokens]
    # No template in the model: plain "role: content" lines, then the assistant's turn.
    text = "".join(f"{msg['role']}: {msg['content']}\n" for msg in messages) + "assistant: "
    return list(tokenizer.encode(text))


def prompt_tokens(tokenizer: Any, req: m.Generate) -> list[int]:
    if req.kind == "chat":
        try:
            tokens = chat_prompt(tokenizer, req.messages or [], req.tools)
        except Exception as e:  # noqa: BLE001 -- e.g. a chat template that rejects the roles
            raise RequestError(f"{type(e).__name__}: {e}", "messages") from e
    else:
        text = req.prompt or ""
        # BOS as the model wants it, unless the text already starts with it (as mlx-lm does).
        bos = getattr(tokenizer, "bos_token", None)
        tokens = list(tokenizer.encode(text, add_special_tokens=bos is None
                                       or not text.startswith(bos))) if text else []
    return [int(t) for t in tokens]


def prompt_param(req: m.Generate) -> str:
    return "messages" if req.kind == "chat" else "prompt"


@dataclass(frozen=True)
class Checked:
    """A request as an engine takes it: its prompt, and every number checked for the model."""

    prompt: list[int]
    max_tokens: int
    processors: list[Processor]
    sampler: Sampler


def read_prompt(tokenizer: Any, req: m.Generate, vocab: int, window: int | None,
                grammars: Grammars | None = None) -> Prompt:
    """The long part of taking a request (chat template, tokenizer, a check per token: seconds
    for megabytes; its grammar compiled), in Python, the tokenizer and the grammar engine: safe
    off the thread that runs mlx."""
    fmt = tool_calls.ToolFormat.of(tokenizer)
    tool_calls.check(fmt, req)
    prompt = prompt_tokens(tokenizer, req)
    rules.prompt_ids(prompt, vocab, prompt_param(req))
    max_tokens = rules.fit_window(len(prompt), rules.max_tokens(req.max_tokens), window,
                                  prompt_param(req))
    return Prompt(prompt, max_tokens, constraint(grammars, fmt, req))


def constraint(grammars: Grammars | None, fmt: tool_calls.ToolFormat | None,
               req: m.Generate) -> Constraint | None:
    """The grammar a request's output must follow: a forced tool call, or its response_format."""
    forced = req.tool_choice in ("required", "function") and req.tools
    if not forced and req.response_format is None:
        return None
    if grammars is None:
        raise RequestError("constrained decoding is not available on this engine",
                           "tool_choice" if forced else "response_format")
    if forced:
        assert fmt is not None  # tool_calls.check refused tools on a model without a format
        grammar = tool_calls.forced_grammar(fmt, req, lambda s: grammars.literal(s, "tools"))
        return grammars.compile(grammar, "tools")
    assert req.response_format is not None
    return grammars.json_schema(req.response_format)


def check_request(tokenizer: Any, req: m.Generate, vocab: int, window: int | None,
                  read: Prompt | None = None, grammars: Grammars | None = None) -> Checked:
    """Everything of a request that reaches mlx, checked against the model as loaded:
    RequestError (naming the field) for what it cannot take. The same on every rank. `read`:
    its prompt, when already read (elsewhere: exod.runner.serving.reading)."""
    if read is None:
        read = read_prompt(tokenizer, req, vocab, window, grammars)
    processors = bias_processors(req.logit_bias, vocab)
    if read.constraint is not None:  # last: nothing after it may allow a token it forbids
        processors.append(read.constraint)
    return Checked(read.tokens, read.max_tokens, processors, make_request_sampler(req))


def vocab_size(model: Any, tokenizer: Any) -> int:
    """Rows of the logits: the model's vocabulary (the tokenizer's may be smaller)."""
    n = model_checks.model_vocab(model)
    return n if n is not None else len(tokenizer)


def bias_processors(bias: dict[str, float], vocab: int) -> list[Processor]:
    """logit_bias as a logits processor. Ids are checked here too, not only by the API: an
    out-of-range index in `logits.at[...]` writes outside the array. The processor checks
    them again against the real width of the logits at its first call."""
    ids = rules.logit_bias(bias)
    if not ids:
        return []
    rules.bias_ids(list(ids), vocab)
    return [model_checks.bias_processor(ids)]


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


def make_request_sampler(req: m.Generate) -> Sampler:
    """Greedy requests share mlx-lm's one greedy sampler, which lets the batch sample them in
    one call; every sampling request gets a KeyedSampler. The numbers are checked again here,
    whatever sent them: nothing reaches mlx unchecked."""
    temperature = rules.number("temperature", req.temperature)
    top_p = rules.number("top_p", req.top_p)
    # top_p 0 keeps only the most probable token (mlx-lm takes 0 for "off": the opposite).
    if model_checks.greedy_temperature(temperature) or top_p == 0:
        return greedy_sampler
    return KeyedSampler(temperature, top_p, req.seed)
