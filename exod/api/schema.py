"""Request bodies of /v1/chat/completions and /v1/completions, checked into a `GenRequest`
(what the runner receives). Which fields each endpoint takes is said here; every rule a field
must pass, and its message, is in exod.core.request_rules (the runner checks the same rules
again). A broken rule is a 400 naming the `param`. No field is ignored silently: what exod does
with each field of OpenAI's requests is exod.api.fields.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, ParamSpec, TypeVar

from exod.api.errors import bad_request
from exod.api.fields import check_fields
from exod.core import request_rules as rules
from exod.core.request_rules import RequestError
from exod.messages import Generate

P = ParamSpec("P")
T = TypeVar("T")


@dataclass(frozen=True)
class GenRequest:
    """A checked request: the generation the runner receives, and what only HTTP needs."""

    gen: Generate  # its id is set by the link
    model: str
    stream: bool = False
    include_usage: bool = False
    max_tokens_param: str | None = None  # the field the client set, if any (for errors)


@dataclass(frozen=True)
class ModelLimits:
    """What a model takes, from its config.json and the instance's config: None = unknown."""

    vocab: int | None = None
    context: int | None = None  # the model's context window
    cap: int | None = None  # the instance's own `max_tokens_cap`
    schema_bytes: int = rules.MAX_SCHEMA_BYTES  # the instance's grammar.max_schema_kib


def _http(fn: Callable[P, T]) -> Callable[P, T]:
    """A broken request rule as the client sees it: 400, naming the field."""
    @functools.wraps(fn)
    def checked(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return fn(*args, **kwargs)
        except RequestError as e:
            raise bad_request(str(e), e.param) from None
    return checked


@_http
def parse_chat(raw: Any) -> GenRequest:
    b = rules.body(raw)
    check_fields(b, "chat")
    msgs = rules.messages(b.get("messages"))
    # Both are checked; the newer name wins. A null is a field not set (some clients send
    # every field).
    old = rules.max_tokens(b.get("max_tokens"), "max_tokens", rules.DEFAULT_MAX_TOKENS_CHAT)
    new = b.get("max_completion_tokens")
    param = "max_completion_tokens" if new is not None else \
        "max_tokens" if b.get("max_tokens") is not None else None
    logprobs = rules.logprobs(b.get("logprobs"))
    gen = Generate(id="", kind="chat", messages=msgs,
                   max_tokens=rules.max_tokens(new, "max_completion_tokens", old), **_sampling(b),
                   logprobs=logprobs,
                   top_logprobs=rules.top_logprobs(b.get("top_logprobs"), logprobs),
                   chat_template_kwargs=rules.chat_template_kwargs(b.get("chat_template_kwargs")),
                   **_agent(b))
    return GenRequest(gen, rules.model(b.get("model")), *_streaming(b), max_tokens_param=param)


@_http
def parse_completion(raw: Any) -> GenRequest:
    b = rules.body(raw)
    check_fields(b, "completion")
    prompt = rules.prompt(b.get("prompt"))
    rules.echo(b.get("echo"))
    top = rules.completion_logprobs(b.get("logprobs"))
    gen = Generate(id="", kind="completion", prompt=prompt,
                   max_tokens=rules.max_tokens(b.get("max_tokens"), "max_tokens",
                                               rules.DEFAULT_MAX_TOKENS_COMPLETION),
                   **_sampling(b), logprobs=top is not None, top_logprobs=top or 0)
    return GenRequest(gen, rules.model(b.get("model")), *_streaming(b),
                      max_tokens_param="max_tokens" if b.get("max_tokens") is not None else None)


def _agent(b: dict[str, Any]) -> dict[str, Any]:
    """The fields of `Generate` an agent sends: tools and structured output."""
    listed = rules.tools(b.get("tools"))
    choice, function = rules.tool_choice(b.get("tool_choice"), listed)
    return {"tools": listed, "strict_tools": rules.strict_tools(b.get("tools")),
            "tool_choice": choice, "tool_name": function,
            "parallel_tool_calls": rules.flag(b.get("parallel_tool_calls"),
                                              "parallel_tool_calls", True),
            "response_format": rules.response_format(b.get("response_format"), choice)}


def _schema_size(gen: Generate) -> tuple[int, str]:
    """Compact JSON bytes of the schemas a request's grammar is compiled from, and the field."""
    fmt = gen.response_format
    if fmt is not None and "schema" in fmt:
        return len(json.dumps(fmt["schema"], separators=(",", ":"))), "response_format"
    params = [t["function"].get("parameters") for t in gen.tools]
    return sum(len(json.dumps(p, separators=(",", ":"))) for p in params if p), "tools"


def _streaming(b: dict[str, Any]) -> tuple[bool, bool]:
    """(stream, include_usage)."""
    stream = rules.stream(b.get("stream"))
    return stream, rules.stream_options(b.get("stream_options"), stream)


def _sampling(b: dict[str, Any]) -> dict[str, Any]:
    """The fields of `Generate` common to both endpoints."""
    rules.n(b.get("n"))
    stop = rules.stop(b.get("stop"))
    seed = rules.seed(b.get("seed"))
    return {
        "temperature": rules.number("temperature", b.get("temperature")),
        "top_p": rules.number("top_p", b.get("top_p")),
        "stop": stop,
        "seed": seed,
        # The wire's keys are strings (JSON's): the ids, normalised ("0001" is "1").
        "logit_bias": {str(k): v for k, v in rules.logit_bias(b.get("logit_bias")).items()},
        "top_k": rules.top_k(b.get("top_k")),
        "min_p": rules.number("min_p", b.get("min_p")),
        "repetition_penalty": rules.repetition_penalty(b.get("repetition_penalty")),
        "presence_penalty": rules.number("presence_penalty", b.get("presence_penalty")),
        "frequency_penalty": rules.number("frequency_penalty", b.get("frequency_penalty")),
        **{name: rules.context_size(name, b.get(name)) for name in rules.CONTEXT_SIZES},
    }


@_http
def apply_limits(req: GenRequest, limits: ModelLimits) -> GenRequest:
    """The request checked against its model (its config.json, and the instance's cap): every
    `logit_bias` id inside the vocabulary, `max_tokens` within the context window and the cap;
    the default `max_tokens` shrinks to fit."""
    gen = req.gen
    if limits.vocab is not None:
        rules.bias_ids([int(k) for k in gen.logit_bias], limits.vocab)
    size, param = _schema_size(gen)
    rules.schema_bytes(size, limits.schema_bytes, param)
    n = rules.max_tokens_cap(gen.max_tokens, req.max_tokens_param, limits.context, limits.cap)
    return req if n == gen.max_tokens else replace(req, gen=replace(gen, max_tokens=n))


def with_template_defaults(req: GenRequest, defaults: Mapping[str, Any]) -> GenRequest:
    """A chat request with the instance's chat_template_kwargs under its own."""
    if req.gen.kind != "chat" or not defaults:
        return req
    merged = {**defaults, **req.gen.chat_template_kwargs}
    return replace(req, gen=replace(req.gen, chat_template_kwargs=merged))


@_http
def with_think_budget(req: GenRequest, raw: Any, param: str) -> GenRequest:
    """A chat request with a thinking budget (a dialect's field, `param`: chat completions has
    none): the runner closes the think block past it."""
    return replace(req, gen=replace(req.gen, think_budget=rules.think_budget(raw, param)))
