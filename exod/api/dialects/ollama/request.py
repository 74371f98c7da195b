"""Ollama's `POST /api/chat` and `POST /api/generate` onto the one request every dialect becomes
(exod.api.request.GenRequest).

What each field is, is the dialect's table (exod.api.dialects.ollama.fields); each field passes the
core's rules under the name the client sent (`options.temperature`, `format`), so an error
names what the client sent. A body with nothing to generate (no `messages`, no `prompt`) loads
the model or, with `keep_alive: 0`, stops it: `OllamaView.load_only`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Literal

from exod.api.dialects.anthropic.request import EFFORT_THINKS
from exod.api.dialects.ollama.fields import OLLAMA_CHAT, OLLAMA_GENERATE
from exod.api.fields import Reading
from exod.api.request import GenRequest, function_tools, http, tool_names
from exod.core import images as pictures
from exod.core import keep_alive as keep
from exod.core import request_rules as rules
from exod.core.request_rules import RequestError
from exod.wire.messages import Generate, Image

Endpoint = Literal["chat", "generate"]
UNBOUNDED = (1 << 31) - 1  # num_predict -1: clamped to the context window (and the cap)
ROLES = ("system", "user", "assistant", "tool")
OPTIONS = "options"
FIM_PLACEHOLDER = "\0"  # an empty prefix, before fill_in_middle places the suffix
# The core's fields as the client names them, for the runner's errors.
NAMES = {"max_tokens": "options.num_predict", "stop": "options.stop",
         "temperature": "options.temperature", "top_p": "options.top_p",
         "top_k": "options.top_k", "min_p": "options.min_p", "seed": "options.seed",
         "repetition_penalty": "options.repeat_penalty",
         "presence_penalty": "options.presence_penalty",
         "frequency_penalty": "options.frequency_penalty",
         "context_window": "options.num_ctx", "response_format": "format",
         "response_format.json_schema.schema": "format"}


@dataclass(frozen=True)
class OllamaView:
    """What the answer (and the daemon) need beyond the core's request."""

    endpoint: Endpoint
    model: str
    stream: bool = True
    keep_alive: float | None = None  # seconds (math.inf: keep), None: not asked
    load_only: bool = False  # nothing to generate: load (or with keep_alive 0, stop) it
    think: bool | None = None  # what `think` asked for
    suffix: str | None = None  # /api/generate's fill in the middle, once the model is known
    ignored: tuple[str, ...] = ()


@http
def parse(raw: Any, endpoint: Endpoint,
          strict: bool = False) -> tuple[GenRequest | None, OllamaView]:
    """The request (None for a body with nothing to generate), and its view."""
    r = Reading(OLLAMA_CHAT if endpoint == "chat" else OLLAMA_GENERATE, strict)
    b = rules.body(raw)
    r.keys(b, "body")
    model = rules.model(b.get("model"))
    stream = rules.flag(b.get("stream"), "stream", True)
    alive = keep.parse(b.get("keep_alive"))
    think = _think(b.get("think"))
    options = _options(b.get(OPTIONS), r)
    logprobs = rules.logprobs(b.get("logprobs"))
    top = rules.top_logprobs(b.get("top_logprobs"), logprobs)
    fmt = _format(b.get("format"))
    common = {"logprobs": logprobs, "top_logprobs": top, "response_format": fmt, **options}
    if endpoint == "chat":
        listed, origins = function_tools(b.get("tools"), r, "function")
        if not b.get("messages"):
            return None, OllamaView(endpoint, model, stream, alive, True, think, None, r.ignored)
        seen = OllamaImages()
        messages = _messages(b["messages"], r, seen)
        gen = Generate(id="", kind="chat", messages=messages, tools=rules.for_template(listed),
                       chat_template_kwargs=_switch(think), **common, images=seen.images,
                       names={**NAMES, **tool_names(origins), **seen.names})
    else:
        prompt = rules.text(rules.text_field(b.get("prompt", ""), "prompt"), "prompt")
        suffix = b.get("suffix")
        if suffix is not None:
            suffix = rules.text(rules.text_field(suffix, "suffix"), "suffix")
        if not prompt and not suffix:
            return None, OllamaView(endpoint, model, stream, alive, True, think, None, r.ignored)
        gen, suffix = _generation(b, prompt, suffix or None, think, common)
        return (GenRequest(gen, model, stream, False, r.ignored),
                OllamaView(endpoint, model, stream, alive, False, think, suffix, r.ignored))
    return (GenRequest(gen, model, stream, False, r.ignored),
            OllamaView(endpoint, model, stream, alive, False, think, None, r.ignored))


def _think(raw: Any) -> bool | None:
    """`think`: a boolean, or an effort, which a local template's one switch takes as on or
    off (as Anthropic's `effort` maps)."""
    if raw is None or isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw in ("high", "medium", "low"):
        return EFFORT_THINKS[raw]
    raise RequestError('`think` must be true, false, "high", "medium" or "low"', "think")


def _switch(think: bool | None) -> dict[str, Any]:
    return {} if think is None else {"enable_thinking": think}


def _format(raw: Any) -> dict[str, Any] | None:
    """`format`: "json" (any JSON object) or a JSON schema the answer follows."""
    if raw is None or raw == "":
        return None
    if raw == "json":
        return rules.json_output(None, False, "auto", "format")
    if isinstance(raw, dict):
        return rules.json_output(raw, True, "auto", "format", "format")
    raise RequestError('`format` must be "json" or a JSON schema (an object)', "format")


def _options(raw: Any, r: Reading) -> dict[str, Any]:
    """`options` as the fields of `Generate` (the sampling set, the length, the window)."""
    if raw is None:
        raw = {}
    o = rules.obj(raw, OPTIONS)
    r.keys(o, "options", OPTIONS)

    def at(key: str) -> str:
        return f"{OPTIONS}.{key}"

    out: dict[str, Any] = {
        "max_tokens": _num_predict(o.get("num_predict")),
        "context_window": rules.context_window(o.get("num_ctx"), at("num_ctx")),
        "stop": rules.stop(o.get("stop"), at("stop")),
        "seed": rules.seed(o.get("seed"), at("seed")),
        "top_k": rules.top_k(o.get("top_k"), at("top_k")),
        "repetition_penalty": rules.repetition_penalty(o.get("repeat_penalty"),
                                                       at("repeat_penalty")),
        **{name: rules.number(name, o.get(name), at(name)) for name in (
            "temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty")},
    }
    last = o.get("repeat_last_n")
    if last is not None:
        n = rules.integer(last, at("repeat_last_n"), 0, -1, rules.MAX_CONTEXT_SIZE)
        if n == 0:  # Ollama's "disabled": no penalty looks back at all
            out.update(repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0)
        else:
            size = rules.MAX_CONTEXT_SIZE if n == -1 else n
            out.update({name: size for name in rules.CONTEXT_SIZES})
    return out


def _num_predict(raw: Any) -> int:
    if raw is None or (isinstance(raw, int) and not isinstance(raw, bool) and raw in (-1, -2)):
        return UNBOUNDED
    return rules.max_tokens(raw, f"{OPTIONS}.num_predict")


# ---- /api/chat -----------------------------------------------------------------------------------
class OllamaImages:
    """The images of a request's messages (each message's `images`, base64): the request's
    list, and where each is placed (an image part, before the message's text)."""

    def __init__(self) -> None:
        self.images: list[Image] = []
        self.names: dict[str, str] = {}  # an image part's place → the client's field
        self._bytes = 0

    def place(self, raw: Any, param: str, turn: int, text: str) -> list[dict[str, Any]] | str:
        """A message's content with its images: `text` alone when it has none."""
        if raw is None or raw == []:
            return text
        listed = rules.array(raw, param, pictures.MAX_IMAGES, what="images")
        parts: list[dict[str, Any]] = []
        for k, data in enumerate(listed):
            where = f"{param}[{k}]"
            if not isinstance(data, str):
                raise RequestError(f"`{where}` must be an image's bytes in base64", where)
            try:
                self._bytes += len(pictures.decode(data))
            except pictures.ImageError as e:
                raise RequestError(f"`{where}`: {e}", where) from None
            if len(self.images) >= pictures.MAX_IMAGES or \
                    self._bytes > pictures.MAX_REQUEST_IMAGE_BYTES:
                raise RequestError(f"`{where}`: a request takes at most "
                                   f"{pictures.MAX_IMAGES} images, "
                                   f"{pictures.MAX_REQUEST_IMAGE_BYTES >> 20} MiB in all", where)
            self.names[f"messages[{turn}].content[{len(parts)}]"] = where
            parts.append({"type": "image", "image": len(self.images)})
            self.images.append(Image(data))
        return parts + ([{"type": "text", "text": text}] if text else [])


def _messages(raw: Any, r: Reading, seen: OllamaImages) -> list[dict[str, Any]]:
    """Ollama's messages as chat completions' (the template's): an assistant's calls with ids
    (Ollama's have none: made here), each tool turn answering one of them (by its
    `tool_name`, else in order), as templates that pair them expect, and a message's images as
    image parts before its text (a text model's runner refuses them, naming them)."""
    out: list[dict[str, Any]] = []
    pending: list[tuple[str, str]] = []  # (id, name) of the last assistant's unanswered calls
    for i, msg in enumerate(rules.messages(raw)):
        param = f"messages[{i}]"
        rules.obj(msg, param)
        r.keys(msg, "message", param)
        role = rules.one_of(msg.get("role"), ROLES, f"{param}.role")
        turn: dict[str, Any] = {"role": role,
                                "content": rules.content(msg.get("content"), f"{param}.content")}
        if msg.get("thinking") not in (None, ""):
            turn["reasoning_content"] = rules.reasoning(msg["thinking"], role,
                                                        f"{param}.thinking")
        if role == "assistant":
            calls = _calls(msg.get("tool_calls"), role, param, i, r)
            pending = [(c["id"], c["function"]["name"]) for c in calls]
            if calls:
                turn["tool_calls"] = calls
        elif msg.get("tool_calls") not in (None, []):
            raise RequestError(f"`{param}.tool_calls`: only an assistant message has tool "
                               "calls", f"{param}.tool_calls")
        if role == "tool":
            turn.update(_answer(msg, param, i, pending))
        checked = rules.message(turn, param)
        checked["content"] = seen.place(msg.get("images"), f"{param}.images", i,
                                        checked["content"])
        out.append(checked)
    return out


def _calls(raw: Any, role: str, param: str, turn: int, r: Reading) -> list[dict[str, Any]]:
    if raw is None:
        return []
    calls = []
    for k, call in enumerate(rules.array(raw, f"{param}.tool_calls", rules.MAX_TOOLS,
                                         what="calls")):
        where = f"{param}.tool_calls[{k}]"
        rules.obj(call, where)
        r.keys(call, "call", where)
        fn = rules.obj(call.get("function"), f"{where}.function")
        r.keys(fn, "call.function", f"{where}.function")
        made = rules.call(call.get("id"), fn.get("name"), fn.get("arguments", {}), where,
                          ("id", "function.name", "function.arguments"))
        calls.append({**made, "id": made.get("id") or f"call_{turn}_{k}"})
    return calls


def _answer(msg: dict[str, Any], param: str, turn: int,
            pending: list[tuple[str, str]]) -> dict[str, Any]:
    """A tool turn's call (its own `tool_call_id`, else the pending call of its `tool_name`,
    else the next pending one) and its tool's name."""
    out: dict[str, Any] = {}
    tool = msg.get("tool_name")
    if tool is not None:
        out["name"] = rules.name(tool, f"{param}.tool_name")
    given = msg.get("tool_call_id")
    match = next((p for p in pending if p[0] == given or (given is None and p[1] == tool)),
                 None) or (pending[0] if pending and given is None else None)
    if match is not None:
        pending.remove(match)
    out["tool_call_id"] = given if given is not None else match[0] if match else \
        f"call_{turn}"
    return out


# ---- /api/generate -------------------------------------------------------------------------------
def _generation(b: dict[str, Any], prompt: str, suffix: str | None, think: bool | None,
                common: dict[str, Any]) -> tuple[Generate, str | None]:
    """/api/generate's request: the prompt as one user turn through the model's template; as
    it is (`raw`); through the client's own `template`; or, with a `suffix` and no template,
    a fill-in-the-middle prompt the daemon builds once it knows the model's tokens (returned:
    the suffix still to place)."""
    raw = rules.flag(b.get("raw"), "raw")
    system = b.get("system")
    if system is not None:
        system = rules.text(rules.text_field(system, "system"), "system")
    template = b.get("template")
    names = {**NAMES, "messages": "prompt"}
    if b.get("images") not in (None, []) and (template is not None or raw or suffix):
        raise RequestError("`images` need the model's chat template: not with `raw`, "
                           "`template` or `suffix`", "images")
    if template is not None:
        text = render(rules.text_field(template, "template"), system or "", prompt,
                      suffix or "")
        return Generate(id="", kind="completion", prompt=text, names=names, **common), None
    for given, key, why in ((raw and system, "system", "`raw` takes the prompt as it is"),
                            (suffix and system, "system", "a `suffix` makes a "
                                                          "fill-in-the-middle prompt")):
        if given:
            raise RequestError(f"`{key}` has no place: {why}", key)
    if suffix is not None or raw:
        # With a suffix, the prompt is placed once the model's tokens are known
        # (`fill_in_middle`); until then a placeholder, never sent as it is.
        return Generate(id="", kind="completion", prompt=prompt or FIM_PLACEHOLDER,
                        names=names, **common), suffix
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    seen = OllamaImages()
    messages.append({"role": "user", "content": seen.place(b.get("images"), "images",
                                                           len(messages), prompt)})
    return Generate(id="", kind="chat", messages=messages, chat_template_kwargs=_switch(think),
                    images=seen.images, names={**names, **seen.names}, **common), None


@http
def fill_in_middle(req: GenRequest, suffix: str, tokens: tuple[str, str, str] | None,
                   model: str) -> GenRequest:
    """A `suffix` request's prompt in the model's fill-in-the-middle tokens: prefix, suffix,
    middle (Qwen2.5-Coder's, StarCoder's and DeepSeek-Coder's order)."""
    if tokens is None:
        raise RequestError(f"`suffix`: {model!r} has no fill-in-the-middle tokens (its "
                           "/api/show capabilities lack `insert`)", "suffix")
    prefix = "" if req.gen.prompt == FIM_PLACEHOLDER else req.gen.prompt or ""
    text = f"{tokens[0]}{prefix}{tokens[1]}{suffix}{tokens[2]}"
    return replace(req, gen=replace(req.gen, prompt=text))


# ---- a client's own template ---------------------------------------------------------------------
_ACTION = re.compile(r"\{\{(-?)\s*(.*?)\s*(-?)\}\}", re.S)
_VARIABLES = {".System", ".Prompt", ".Suffix", ".Response"}


def render(template: str, system: str, prompt: str, suffix: str) -> str:
    """Ollama's Go template of a request, in the subset a prompt template uses: `{{ .System }}`,
    `{{ .Prompt }}`, `{{ .Suffix }}`, `{{ .Response }}` (empty: the answer follows), `{{ if
    .X }}`…`{{ else }}`…`{{ end }}` (nestable), and `{{-`/`-}}` trimming. Any other action is
    refused by name."""
    values = {".System": system, ".Prompt": prompt, ".Suffix": suffix, ".Response": ""}
    out: list[str] = []
    emit = [True]  # per open `if`: whether its current branch is written
    pos = 0
    for m in _ACTION.finditer(template):
        text = template[pos:m.start()]
        if m.group(1):
            text = text.rstrip()
        if all(emit):
            out.append(text)
        pos = m.end()
        if m.group(3):
            rest = template[pos:]
            pos += len(rest) - len(rest.lstrip())
        action = m.group(2)
        words = action.split()
        if action in _VARIABLES:
            if all(emit):
                out.append(values[action])
        elif len(words) == 2 and words[0] == "if" and words[1] in _VARIABLES:
            emit.append(bool(values[words[1]]))
        elif action == "else" and len(emit) > 1:
            emit[-1] = not emit[-1]
        elif action == "end" and len(emit) > 1:
            emit.pop()
        else:
            raise RequestError(f"`template`: {{{{ {action[:40]} }}}} is not supported (only "
                               ".System, .Prompt, .Suffix, .Response, if, else and end)",
                               "template")
    if len(emit) > 1:
        raise RequestError("`template`: an `if` is not closed by `end`", "template")
    out.append(template[pos:])
    return "".join(out)
