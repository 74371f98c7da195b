"""OpenAI chat completions' and completions' bodies onto the one request every dialect becomes
(exod.api.request.GenRequest). What each field is, is the dialect's table
(exod.api.dialects.openai.fields); every rule a field must pass, and its message, is in
exod.core.request_rules, called with the field's name as the client sent it.
"""

from __future__ import annotations

from typing import Any

from exod.api.dialects.openai.fields import CHAT, COMPLETION
from exod.api.fields import ImageReader, Reading
from exod.api.request import GenRequest, function_tools, http, pictured, tool_names
from exod.core import images
from exod.core import request_rules as rules
from exod.core.images import Pictures, Source
from exod.wire.messages import Generate

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
