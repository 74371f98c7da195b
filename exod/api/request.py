"""The one request every dialect's body becomes (`GenRequest`: the generation the runner
receives, and what only HTTP needs), the parts of a body every dialect reads alike (function
tools, pictures), and the request checked against its model. Each dialect's mapping onto it is
its own (exod.api.dialects); what each field of every dialect is (works, no effect, ignored,
refused) is its table there; every rule a field must pass, and its message, is in
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
from exod.api.fields import Reading
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


def _schema_size(gen: Generate) -> tuple[int, str]:
    """Compact JSON bytes of the schemas a request's grammar is compiled from, and the field."""
    fmt = gen.response_format
    if fmt is not None and "schema" in fmt:
        return len(json.dumps(fmt["schema"], separators=(",", ":"))), "response_format"
    params = [t["function"].get("parameters") for t in gen.tools]
    return sum(len(json.dumps(p, separators=(",", ":"))) for p in params if p), "tools"


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
