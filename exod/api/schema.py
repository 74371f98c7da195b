"""The one request every dialect's body becomes (`GenRequest`: the generation the runner
receives, and what only HTTP needs), and the mapping of chat completions' and completions'
bodies onto it. What each field of every dialect is (works, no effect, ignored, refused) is
its table in exod.api.fields; every rule a field must pass, and its message, is in
exod.core.request_rules (the runner checks the same rules again), called with the field's
name as the client sent it. A broken rule is a 400 naming that field.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, ParamSpec, TypeVar

from exod.api.errors import bad_request
from exod.api.fields import CHAT, COMPLETION, Reading
from exod.api.fields.policy import ImageReader
from exod.core import images
from exod.core import request_rules as rules
from exod.core.images import Pictures, Source
from exod.core.request_rules import RequestError
from exod.wire.messages import Generate, Image

P = ParamSpec("P")
T = TypeVar("T")


@dataclass(frozen=True)
class GenRequest:
    """A checked request: the generation the runner receives, and what only HTTP needs."""

    gen: Generate  # its id is set by the link
    model: str
    stream: bool = False
    include_usage: bool = False
    # The fields accepted and not used (unknown, or naming what exod does not run), by their
    # paths without indexes: the x-exod-ignored-fields header and /metrics name them.
    ignored: tuple[str, ...] = ()
    # The pictures of `gen.images`, in order, as the client gave them: an http(s) URL's bytes
    # are fetched by the daemon before the request goes on (exod.api.image_fetch); until then
    # its image in `gen` is empty.
    pictures: tuple[Source, ...] = ()


@dataclass(frozen=True)
class ModelLimits:
    """What a model takes, from its config.json and the instance's config: None = unknown."""

    vocab: int | None = None
    context: int | None = None  # the model's context window
    cap: int | None = None  # the instance's own `max_tokens_cap`
    schema_bytes: int = rules.MAX_SCHEMA_BYTES  # the instance's grammar.max_schema_kib


def http(fn: Callable[P, T]) -> Callable[P, T]:
    """A broken request rule as the client sees it: 400, naming the field."""
    @functools.wraps(fn)
    def checked(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return fn(*args, **kwargs)
        except RequestError as e:
            raise bad_request(str(e), e.param) from None
    return checked


@http
def parse_chat(raw: Any, strict: bool = False) -> GenRequest:
    r = Reading(CHAT, strict)
    b = rules.body(raw)
    r.keys(b, "body")
    pics = Pictures()
    msgs = [_message(m, f"messages[{i}]", r, pics)
            for i, m in enumerate(rules.messages(b.get("messages")))]
    shown = pictured(pics, msgs)
    # Both are checked; the newer name wins. A null is a field not set (some clients send
    # every field).
    old = rules.max_tokens(b.get("max_tokens"), "max_tokens", rules.DEFAULT_MAX_TOKENS_CHAT)
    new = b.get("max_completion_tokens")
    names = {"max_tokens": "max_completion_tokens"} if new is not None else {}
    logprobs = rules.logprobs(b.get("logprobs"))
    listed, origins = function_tools(b.get("tools"), r)
    gen = Generate(id="", kind="chat", messages=msgs,
                   max_tokens=rules.max_tokens(new, "max_completion_tokens", old), **_sampling(b),
                   logprobs=logprobs,
                   top_logprobs=rules.top_logprobs(b.get("top_logprobs"), logprobs),
                   chat_template_kwargs=rules.chat_template_kwargs(b.get("chat_template_kwargs")),
                   names={**names, **tool_names(origins), **shown.names},
                   images=shown.images, **_agent(b, listed, r))
    return GenRequest(gen, rules.model(b.get("model")), *_streaming(b, r), ignored=r.ignored,
                      pictures=tuple(pics.sources))


@http
def parse_completion(raw: Any, strict: bool = False) -> GenRequest:
    r = Reading(COMPLETION, strict)
    b = rules.body(raw)
    r.keys(b, "body")
    prompt = rules.prompt(b.get("prompt"))
    top = rules.completion_logprobs(b.get("logprobs"))
    gen = Generate(id="", kind="completion", prompt=prompt,
                   max_tokens=rules.max_tokens(b.get("max_tokens"), "max_tokens",
                                               rules.DEFAULT_MAX_TOKENS_COMPLETION),
                   **_sampling(b), logprobs=top is not None, top_logprobs=top or 0)
    return GenRequest(gen, rules.model(b.get("model")), *_streaming(b, r), ignored=r.ignored)


@dataclass(frozen=True)
class Pictured:
    """What `Generate` carries of a request's pictures: its images (a URL's empty until it is
    fetched) and the names of their parts where the client's are not the messages' own."""

    images: list[Image]
    names: dict[str, str]


def pictured(pics: Pictures, messages: list[dict[str, Any]]) -> Pictured:
    """What `Generate` carries of the pictures the messages place (only a user's may: a
    template shows no picture in another turn)."""
    placed = {}
    for i, msg in enumerate(messages):
        if not isinstance(msg.get("content"), list):
            continue
        for j, part in enumerate(msg["content"]):
            if part["type"] != "image":
                continue
            if msg["role"] != "user":
                where = pics.sources[part["image"]].where
                raise RequestError(f"`{where}`: a picture belongs to a user message, not to "
                                   f"a {msg['role']} message", where)
            placed[part["image"]] = f"messages[{i}].content[{j}]"
    return Pictured([Image(s.data or "") for s in pics.sources],
                    {at: pics.sources[n].where for n, at in placed.items()
                     if pics.sources[n].where != at})


def _message(raw: Any, param: str, r: Reading, pics: Pictures) -> dict[str, Any]:
    """One message: its keys against the table, its parts and calls too, then the rules."""
    if not isinstance(raw, dict):
        return rules.message(raw, param)  # which says what a message must be
    r.keys(raw, "message", param)
    msg = dict(raw)
    if isinstance(raw.get("content"), list):  # the parts exod reads; the others ignored
        msg["content"] = images.joined(r.content(raw["content"], f"{param}.content", "part",
                                                 "part", pics, {"image_url": _image(r)}))
    calls = raw.get("tool_calls")
    if isinstance(calls, list):
        for k, call in enumerate(calls):
            where = f"{param}.tool_calls[{k}]"
            if isinstance(call, dict):
                r.keys(call, "call", where)
                if isinstance(call.get("function"), dict):
                    r.keys(call["function"], "call.function", f"{where}.function")
    return rules.message(msg, param)


def _image(r: Reading) -> ImageReader:
    def read(part: dict[str, Any], where: str) -> Source:
        """An `image_url` part: `{url, detail}` (or, as some clients send it, the URL alone)."""
        r.keys(part, "image_part", where)
        value = part.get("image_url")
        if isinstance(value, dict):
            r.keys(value, "image_url", f"{where}.image_url")
            return images.image_url(value.get("url"), f"{where}.image_url.url")
        return images.image_url(value, f"{where}.image_url")
    return read


def function_tools(raw: Any, r: Reading, default: str | None = None
                   ) -> tuple[list[dict[str, Any]], list[str]]:
    """The function tools (their `strict` mark beside them) and where each came from;
    `default`: the type of a tool that names none (Ollama's clients may leave it out)."""
    if raw is None:
        return [], []
    listed, origins = [], []
    for tool, param in r.items(raw, "tools", "tool", "tool", rules.MAX_TOOLS, default):
        r.keys(tool, "tool", param)
        fn = rules.obj(tool.get("function"), f"{param}.function")
        r.keys(fn, "function", f"{param}.function")
        listed.append(rules.function(fn, f"{param}.function"))
        origins.append(f"{param}.function.parameters")
    return rules.unique(listed, "tools"), origins


def tool_names(origins: list[str]) -> dict[str, str]:
    """The client's name of each tool's parameters, where it is not the request's own
    (`tools[k].function.parameters`): tools ignored or unfolded move the others."""
    return {f"tools[{k}].function.parameters": at for k, at in enumerate(origins)
            if at != f"tools[{k}].function.parameters"}


def _agent(b: dict[str, Any], listed: list[dict[str, Any]], r: Reading) -> dict[str, Any]:
    """The fields of `Generate` an agent sends: tools and structured output."""
    for key, kind in (("tool_choice", "tool_choice"), ("response_format", "response_format")):
        if isinstance(b.get(key), dict):
            r.keys(b[key], kind, key)
    if isinstance(b.get("tool_choice"), dict) and isinstance(b["tool_choice"].get("function"),
                                                             dict):
        r.keys(b["tool_choice"]["function"], "tool_choice.function", "tool_choice.function")
    fmt = b.get("response_format")
    if isinstance(fmt, dict) and isinstance(fmt.get("json_schema"), dict):
        r.keys(fmt["json_schema"], "json_schema", "response_format.json_schema")
    choice, function = rules.tool_choice(b.get("tool_choice"), listed)
    return {"tools": rules.for_template(listed), "strict_tools": rules.strict_tools(listed),
            "tool_choice": choice, "tool_name": function,
            "parallel_tool_calls": rules.flag(b.get("parallel_tool_calls"),
                                              "parallel_tool_calls", True),
            "response_format": rules.response_format(fmt, choice)}


def _schema_size(gen: Generate) -> tuple[int, str]:
    """Compact JSON bytes of the schemas a request's grammar is compiled from, and the field."""
    fmt = gen.response_format
    if fmt is not None and "schema" in fmt:
        return len(json.dumps(fmt["schema"], separators=(",", ":"))), "response_format"
    params = [t["function"].get("parameters") for t in gen.tools]
    return sum(len(json.dumps(p, separators=(",", ":"))) for p in params if p), "tools"


def _streaming(b: dict[str, Any], r: Reading) -> tuple[bool, bool]:
    """(stream, include_usage)."""
    stream = rules.stream(b.get("stream"))
    if isinstance(b.get("stream_options"), dict):
        r.keys(b["stream_options"], "stream_options", "stream_options")
    return stream, rules.stream_options(b.get("stream_options"), stream)


def _sampling(b: dict[str, Any]) -> dict[str, Any]:
    """The fields of `Generate` common to both endpoints."""
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


@http
def apply_limits(req: GenRequest, limits: ModelLimits) -> GenRequest:
    """The request checked against its model (its config.json, and the instance's cap): every
    `logit_bias` id inside the vocabulary, the schemas within the instance's bound;
    `max_tokens` clamped to the context window and the cap."""
    gen = req.gen
    if limits.vocab is not None:
        rules.bias_ids([int(k) for k in gen.logit_bias], limits.vocab)
    size, param = _schema_size(gen)
    rules.schema_bytes(size, limits.schema_bytes, gen.named(param))
    n = rules.max_tokens_cap(gen.max_tokens, limits.context, limits.cap)
    return req if n == gen.max_tokens else replace(req, gen=replace(gen, max_tokens=n))


def with_template_defaults(req: GenRequest, defaults: Mapping[str, Any]) -> GenRequest:
    """A chat request with the instance's chat_template_kwargs under its own."""
    if req.gen.kind != "chat" or not defaults:
        return req
    merged = {**defaults, **req.gen.chat_template_kwargs}
    return replace(req, gen=replace(req.gen, chat_template_kwargs=merged))
