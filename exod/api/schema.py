"""Request bodies of /v1/chat/completions and /v1/completions: checked here, field by field,
into a `GenRequest` (what the runner receives). Fields exod does not use are ignored, as
clients send many; fields it uses must be valid, else a 400 naming the `param`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any

from exod.api.errors import bad_request
from exod.messages import Generate

DEFAULT_MAX_TOKENS_CHAT = 1024
DEFAULT_MAX_TOKENS_COMPLETION = 16  # the OpenAI reference's default for /v1/completions
MAX_STOPS = 16
MAX_STOP_CHARS = 1024
MAX_BIAS = 1024  # entries of logit_bias
_TOKEN_ID = re.compile(r"[0-9]{1,10}")  # ASCII digits only: str.isdigit() takes '²' too
ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass(frozen=True)
class GenRequest:
    """A checked request: the generation the runner receives, and what only HTTP needs."""

    gen: Generate  # its id is set by the link
    model: str
    stream: bool = False
    include_usage: bool = False
    max_tokens_param: str | None = None  # the field the client set, if any (for errors)


def parse_chat(body: Any) -> GenRequest:
    b = _object(body)
    messages = b.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("`messages` must be a non-empty array of messages", "messages")
    # Both are checked; the newer name wins. A null is a field not set (some clients send
    # every field).
    old = _max_tokens(b.get("max_tokens"), "max_tokens", DEFAULT_MAX_TOKENS_CHAT)
    new = b.get("max_completion_tokens")
    param = "max_completion_tokens" if new is not None else \
        "max_tokens" if b.get("max_tokens") is not None else None
    gen = Generate(
        id="", kind="chat", messages=[_message(m, i) for i, m in enumerate(messages)],
        max_tokens=_max_tokens(new, "max_completion_tokens", old), **_sampling(b))
    return GenRequest(gen, _model(b), *_streaming(b), max_tokens_param=param)


def parse_completion(body: Any) -> GenRequest:
    b = _object(body)
    prompt = b.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise bad_request("`prompt` must be a string (batches and token arrays are not "
                          "supported)", "prompt")
    _text(prompt, "prompt")
    if not prompt:
        raise bad_request("`prompt` must not be empty", "prompt")
    if b.get("echo"):
        raise bad_request("`echo` is not supported", "echo")
    gen = Generate(
        id="", kind="completion", prompt=prompt,
        max_tokens=_max_tokens(b.get("max_tokens"), "max_tokens",
                               DEFAULT_MAX_TOKENS_COMPLETION), **_sampling(b))
    return GenRequest(gen, _model(b), *_streaming(b),
                      max_tokens_param="max_tokens" if b.get("max_tokens") is not None else None)


# ---- pieces -----------------------------------------------------------------------------
def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body


def _model(b: dict[str, Any]) -> str:
    model = b.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("`model` must name an instance", "model")
    return model


def _message(m: Any, i: int) -> dict[str, str]:
    param = f"messages[{i}]"
    if not isinstance(m, dict):
        raise bad_request(f"`{param}` must be an object", param)
    role = m.get("role")
    if role not in ROLES:
        raise bad_request(f"`{param}.role` must be one of {', '.join(ROLES)}", f"{param}.role")
    content = m.get("content")
    if content is None:
        content = ""
    elif isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") == "text"
                    and isinstance(part.get("text"), str)):
                raise bad_request(f"`{param}.content[{j}]`: only text parts are supported",
                                  f"{param}.content")
            parts.append(part["text"])
        content = "".join(parts)
    elif not isinstance(content, str):
        raise bad_request(f"`{param}.content` must be a string or an array of text parts",
                          f"{param}.content")
    _text(content, f"{param}.content")
    # Chat templates know `system`; `developer` is OpenAI's newer name for it.
    return {"role": "system" if role == "developer" else role, "content": content}


def _text(value: str, param: str) -> None:
    """JSON may spell a lone surrogate (`"\\ud800"`), which is no text at all: it cannot be
    encoded for the runner, nor tokenized."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise bad_request(f"`{param}` holds a lone surrogate at character {e.start}, which is "
                          "not text", param) from None


def _number(b: dict[str, Any], name: str, default: float, lo: float, hi: float) -> float:
    v = b.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
        raise bad_request(f"`{name}` must be a number from {lo:g} to {hi:g}", name)
    return float(v)


def _max_tokens(v: Any, param: str, default: int) -> int:
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise bad_request(f"`{param}` must be an integer of at least 1", param)
    return v


def _streaming(b: dict[str, Any]) -> tuple[bool, bool]:
    """(stream, include_usage)."""
    stream = b.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise bad_request("`stream` must be a boolean", "stream")
    options = b.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise bad_request("`stream_options` is only allowed when `stream` is true",
                              "stream_options")
        if not isinstance(options, dict) or not isinstance(options.get("include_usage", False),
                                                           bool):
            raise bad_request("`stream_options.include_usage` must be a boolean",
                              "stream_options")
        include_usage = bool(options.get("include_usage", False))
    return bool(stream), include_usage


def _sampling(b: dict[str, Any]) -> dict[str, Any]:
    """The fields of `Generate` common to both endpoints."""
    n = b.get("n")
    if n is not None and (type(n) is not int or n != 1):  # neither True nor 1.0
        raise bad_request("`n` must be 1: exod returns one choice", "n")
    stop = b.get("stop")
    if stop is None:
        stops: list[str] = []
    elif isinstance(stop, str):
        stops = [stop]
    elif (isinstance(stop, list) and len(stop) <= MAX_STOPS
          and all(isinstance(s, str) for s in stop)):
        stops = list(stop)
    else:
        raise bad_request(f"`stop` must be a string or an array of at most {MAX_STOPS} strings",
                          "stop")
    if any(not s for s in stops):
        raise bad_request("`stop` sequences must not be empty", "stop")
    if any(len(s) > MAX_STOP_CHARS for s in stops):
        raise bad_request(f"`stop` sequences are at most {MAX_STOP_CHARS} characters", "stop")
    for s in stops:
        _text(s, "stop")
    seed = b.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise bad_request("`seed` must be an integer", "seed")
    return {
        "temperature": _number(b, "temperature", 1.0, 0.0, 2.0),
        "top_p": _number(b, "top_p", 1.0, 0.0, 1.0),
        "stop": stops,
        "seed": seed,
        "logit_bias": _logit_bias(b.get("logit_bias")),
    }


def _logit_bias(bias: Any) -> dict[str, float]:
    """Token ids (as decimal strings, normalised) → finite numbers from -100 to 100. Whether an
    id is inside the vocabulary is checked against the model (`apply_limits`)."""
    if bias is None:
        return {}
    if not isinstance(bias, dict) or len(bias) > MAX_BIAS or not all(
            isinstance(k, str) and _TOKEN_ID.fullmatch(k) and not isinstance(v, bool)
            and isinstance(v, (int, float)) and math.isfinite(v) and -100 <= v <= 100
            for k, v in bias.items()):
        raise bad_request(f"`logit_bias` maps at most {MAX_BIAS} token ids to numbers from "
                          "-100 to 100", "logit_bias")
    return {str(int(k)): float(v) for k, v in bias.items()}


@dataclass(frozen=True)
class ModelLimits:
    """What a model takes, from its config.json and the instance's config: None = unknown."""

    vocab: int | None = None
    context: int | None = None  # the model's context window
    cap: int | None = None  # the instance's own `max_tokens_cap`

    @property
    def max_tokens(self) -> int | None:
        known = [n for n in (self.context, self.cap) if n is not None]
        return min(known) if known else None


def apply_limits(req: GenRequest, limits: ModelLimits) -> GenRequest:
    """The request checked against its model: a 400 for a token id outside the vocabulary or a
    `max_tokens` beyond the cap; the default `max_tokens` shrinks to fit the cap."""
    gen = req.gen
    if limits.vocab is not None:
        bad = [k for k in gen.logit_bias if int(k) >= limits.vocab]
        if bad:
            raise bad_request(f"`logit_bias`: token id {bad[0]} is outside the model's "
                              f"vocabulary (ids 0 to {limits.vocab - 1})", "logit_bias")
    cap = limits.max_tokens
    if cap is None or gen.max_tokens <= cap:
        return req
    if req.max_tokens_param is None:
        return replace(req, gen=replace(gen, max_tokens=cap))
    what = "the instance's max_tokens_cap" if cap == limits.cap else "the model's context window"
    raise bad_request(f"`{req.max_tokens_param}` is {gen.max_tokens}, more than {cap} "
                      f"({what})", req.max_tokens_param)
