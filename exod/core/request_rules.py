"""The rules a generation request must pass: one copy of each, for the daemon and the runner.

The daemon checks every field of a request body here (exod.api.schema turns a RequestError into
an HTTP 400 naming the field); the runner checks again here, with the numbers of the model as
loaded, whatever sent the request (exod.runner.serving.prepare: nothing reaches mlx unchecked).
Pure logic: no I/O, no mlx, nothing of HTTP.

How a rule is written, so that it is written once:
- One rule = one small function named after its field. It takes the raw value (and the model's
  numbers when the rule needs them: a vocabulary size, a context window), returns the checked
  value, or raises `RequestError(message, param)`. Its message is written there and nowhere
  else: "`field` must be ...", naming the field in backticks, in one line.
- A number with a default and a range is a row of `NUMBERS` instead of a function: `number(name,
  raw)` checks it (finite, inside the range; a bool is no number).
- A limit is a constant here (MAX_...), so the API, the runner and the docs quote one figure.
- Then wire it: exod.api.schema calls it for the endpoints that take the field; when the runner
  must check it again before mlx (it indexes a table, or feeds a sampler),
  exod.runner.serving.prepare calls the same function. tests/unit/test_request_rules.py gets one
  test for the rule, which fails when the rule is dropped.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_MAX_TOKENS_CHAT = 1024
DEFAULT_MAX_TOKENS_COMPLETION = 16  # the OpenAI reference's default for /v1/completions
MAX_STOPS = 16
MAX_STOP_CHARS = 1024
MAX_BIAS = 1024  # entries of logit_bias
BIAS_LIMIT = 100  # a logit_bias value is from -BIAS_LIMIT to BIAS_LIMIT
ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_TOP_K = (1 << 31) - 1  # top_k at or past the vocabulary keeps every token
MAX_REPETITION_PENALTY = 10.0  # a factor on the logits of tokens seen; 1: off
MAX_CONTEXT_SIZE = 1 << 20  # tokens a penalty looks back on
DEFAULT_CONTEXT_SIZE = 20  # mlx-lm's
CONTEXT_SIZES = ("repetition_context_size", "presence_context_size", "frequency_context_size")
MAX_TOP_LOGPROBS = 20  # OpenAI's limit
MAX_TEMPLATE_KWARGS = 32
MAX_TEMPLATE_KWARGS_CHARS = 16 * 1024  # as JSON
_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
# Arguments of the chat template call itself, never template variables a client may set
# (`chat_template` would be a template of the client's own).
RESERVED_TEMPLATE_KWARGS = frozenset((
    "conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length",
    "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs"))
_TOKEN_ID = re.compile(r"[0-9]{1,10}")  # ASCII digits only: str.isdigit() takes '²' too


class RequestError(Exception):
    """The request cannot be served as given; `param` names the field at fault, for the
    client's error (a 400 from the API, a `bad_request` error event from the runner)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


# ---- numbers with a range ----------------------------------------------------------------------
@dataclass(frozen=True)
class Range:
    default: float
    lo: float
    hi: float


NUMBERS: dict[str, Range] = {
    "temperature": Range(1.0, 0.0, 2.0),
    "top_p": Range(1.0, 0.0, 1.0),  # 0 keeps only the most probable token
    "min_p": Range(0.0, 0.0, 1.0),  # 0: off
    "presence_penalty": Range(0.0, -2.0, 2.0),  # OpenAI's range; 0: off
    "frequency_penalty": Range(0.0, -2.0, 2.0),
}


def number(name: str, raw: Any) -> float:
    """A row of NUMBERS: its default when not set (None), else a finite number in its range."""
    r = NUMBERS[name]
    if raw is None:
        return r.default
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw) \
            or not r.lo <= raw <= r.hi:
        raise RequestError(f"`{name}` must be a number from {r.lo:g} to {r.hi:g}", name)
    return float(raw)


# ---- the body and its plain fields -------------------------------------------------------------
def body(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise RequestError("the request body must be a JSON object")
    return raw


def model(raw: Any) -> str:
    if not isinstance(raw, str) or not raw:
        raise RequestError("`model` must name an instance", "model")
    return raw


def text(value: str, param: str) -> str:
    """JSON may spell a lone surrogate (`"\\ud800"`), which is no text at all: it cannot be
    encoded for the runner, nor tokenized."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise RequestError(f"`{param}` holds a lone surrogate at character {e.start}, which is "
                           "not text", param) from None
    return value


def n(raw: Any) -> None:
    if raw is not None and (type(raw) is not int or raw != 1):  # neither True nor 1.0
        raise RequestError("`n` must be 1: exod returns one choice", "n")


def seed(raw: Any) -> int | None:
    if raw is not None and (isinstance(raw, bool) or not isinstance(raw, int)):
        raise RequestError("`seed` must be an integer", "seed")
    return raw


def echo(raw: Any) -> None:
    if raw:
        raise RequestError("`echo` is not supported", "echo")


def stream(raw: Any) -> bool:
    if raw is not None and not isinstance(raw, bool):
        raise RequestError("`stream` must be a boolean", "stream")
    return bool(raw)


def stream_options(raw: Any, streaming: bool) -> bool:
    """Whether the stream ends with a usage chunk."""
    if raw is None:
        return False
    if not streaming:
        raise RequestError("`stream_options` is only allowed when `stream` is true",
                           "stream_options")
    if not isinstance(raw, dict) or not isinstance(raw.get("include_usage", False), bool):
        raise RequestError("`stream_options.include_usage` must be a boolean", "stream_options")
    # include_obfuscation pads chunks against length side channels: it cannot change the
    # answer, and exod's chunks carry no padding either way.
    if set(raw) - {"include_usage", "include_obfuscation"} or \
            not isinstance(raw.get("include_obfuscation", True), bool):
        raise RequestError("`stream_options` takes `include_usage` and `include_obfuscation`, "
                           "booleans", "stream_options")
    return bool(raw.get("include_usage", False))


def stop(raw: Any) -> list[str]:
    if raw is None:
        return []
    stops = [raw] if isinstance(raw, str) else raw
    if not (isinstance(stops, list) and len(stops) <= MAX_STOPS
            and all(isinstance(s, str) for s in stops)):
        raise RequestError(f"`stop` must be a string or an array of at most {MAX_STOPS} "
                           "strings", "stop")
    if any(not s for s in stops):
        raise RequestError("`stop` sequences must not be empty", "stop")
    if any(len(s) > MAX_STOP_CHARS for s in stops):
        raise RequestError(f"`stop` sequences are at most {MAX_STOP_CHARS} characters", "stop")
    return [text(s, "stop") for s in stops]


# ---- what is generated from -------------------------------------------------------------------
def messages(raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list) or not raw:
        raise RequestError("`messages` must be a non-empty array of messages", "messages")
    return [message(m, i) for i, m in enumerate(raw)]


def message(raw: Any, i: int) -> dict[str, Any]:
    param = f"messages[{i}]"
    if not isinstance(raw, dict):
        raise RequestError(f"`{param}` must be an object", param)
    role = raw.get("role")
    if role not in ROLES:
        raise RequestError(f"`{param}.role` must be one of {', '.join(ROLES)}", f"{param}.role")
    # Chat templates know `system`; `developer` is OpenAI's newer name for it.
    return {"role": "system" if role == "developer" else role,
            "content": content(raw.get("content"), f"{param}.content"),
            **turn(raw, role, param)}


def content(raw: Any, param: str) -> str:
    """A message's text: a string, or an array of text parts (joined)."""
    if raw is None:
        return ""
    if isinstance(raw, list):
        parts = []
        for j, part in enumerate(raw):
            if not (isinstance(part, dict) and part.get("type") == "text"
                    and isinstance(part.get("text"), str)):
                raise RequestError(f"`{param}[{j}]`: only text parts are supported", param)
            parts.append(part["text"])
        raw = "".join(parts)
    elif not isinstance(raw, str):
        raise RequestError(f"`{param}` must be a string or an array of text parts", param)
    return text(raw, param)


def prompt(raw: Any) -> str:
    """/v1/completions' prompt: one string (or an array of one)."""
    if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], str):
        raw = raw[0]
    if not isinstance(raw, str):
        raise RequestError("`prompt` must be a string (batches and token arrays are not "
                           "supported)", "prompt")
    text(raw, "prompt")
    if not raw:
        raise RequestError("`prompt` must not be empty", "prompt")
    return raw


def prompt_ids(ids: list[int], vocab: int, param: str) -> None:
    """The prompt as tokens: not empty, and every token must index the embedding table
    (`vocab` rows): a tokenizer may know more tokens (added ones) than the model has rows,
    and a client can spell them."""
    if not ids:
        raise RequestError("the prompt is empty", param)
    bad = [i for i in ids if not 0 <= i < vocab]
    if bad:
        raise RequestError(f"the prompt holds token id {bad[0]}, outside the model's vocabulary "
                           f"(ids 0 to {vocab - 1})", param)


# ---- how much is generated ---------------------------------------------------------------------
def max_tokens(raw: Any, param: str = "max_tokens", default: int | None = None) -> int:
    """`max_tokens` / `max_completion_tokens`: `default` when not set (None), if there is one."""
    if raw is None and default is not None:
        return default
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        raise RequestError(f"`{param}` must be an integer of at least 1", param)
    return raw


def max_tokens_cap(value: int, param: str | None, context: int | None, cap: int | None) -> int:
    """`value` against the model's context window and the instance's `max_tokens_cap` (None:
    unknown, or none): a value the client set (`param`) past them is refused; a default
    shrinks to fit."""
    known = [x for x in (context, cap) if x is not None]
    if not known or value <= min(known):
        return value
    limit = min(known)
    if param is None:
        return limit
    what = "the instance's max_tokens_cap" if limit == cap else "the model's context window"
    raise RequestError(f"`{param}` is {value}, more than {limit} ({what})", param)


def fit_window(prompt: int, max_tokens: int, window: int | None, param: str) -> int:
    """The tokens a request may generate: no position may pass the model's context window,
    where a learned position table (gpt2's) would be read out of bounds. A prompt that fills
    the window is refused; a generation that would pass it ends there (finish reason
    `length`)."""
    if window is None:
        return max_tokens
    if prompt >= window:
        raise RequestError(f"the prompt is {prompt} tokens: it must leave room for one token "
                           f"in the model's context window of {window}", param)
    return min(max_tokens, window - prompt)


# ---- logit_bias --------------------------------------------------------------------------------
def logit_bias(raw: Any) -> dict[int, float]:
    """Token ids (decimal strings, as JSON keys are) → finite numbers from -100 to 100. Whether
    an id is inside the vocabulary is `bias_ids`, against the model."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise RequestError(f"`logit_bias` must map token ids to numbers from -{BIAS_LIMIT} to "
                           f"{BIAS_LIMIT}", "logit_bias")
    if len(raw) > MAX_BIAS:
        raise RequestError(f"`logit_bias` maps at most {MAX_BIAS} token ids (it has "
                           f"{len(raw)})", "logit_bias")
    out: dict[int, float] = {}
    for k, v in raw.items():
        if not (isinstance(k, str) and _TOKEN_ID.fullmatch(k)):
            raise RequestError(f"`logit_bias`: {k!r} is not a token id", "logit_bias")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                or not -BIAS_LIMIT <= v <= BIAS_LIMIT:
            raise RequestError(f"`logit_bias[{k}]` must be a number from -{BIAS_LIMIT} to "
                               f"{BIAS_LIMIT}", "logit_bias")
        out[int(k)] = float(v)
    return out


def bias_ids(ids: list[int], vocab: int) -> None:
    """Every biased id must index the logits (`vocab` wide): the model's config.json in the
    daemon, the real width of the logits in the runner (an out-of-range index in mlx writes
    outside the array)."""
    bad = [i for i in ids if not 0 <= i < vocab]
    if bad:
        raise RequestError(f"`logit_bias`: token id {bad[0]} is outside the model's vocabulary "
                           f"(ids 0 to {vocab - 1})", "logit_bias")


# ---- tools and structured output (what the model can take is the runner's: its template, the
# grammar engine) ------------------------------------------------------------------------------
MAX_TOOLS = 128  # OpenAI's own limit on `tools`
MAX_SCHEMA_DEPTH = 64  # nesting of a schema or of a call's arguments
MAX_SCHEMA_BYTES = 64 * 1024  # default of an instance's grammar.max_schema_kib
TOOL_CHOICES = ("none", "auto", "required")
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # OpenAI's rule for function and schema names


def name(raw: Any, param: str) -> str:
    if not isinstance(raw, str) or not _NAME.fullmatch(raw):
        raise RequestError(f"`{param}` must be 1 to 64 letters, digits, _ . or -", param)
    return raw


def depth(raw: Any, param: str) -> Any:
    """A JSON value nested at most MAX_SCHEMA_DEPTH deep, its numbers finite (Python's JSON
    reads `Infinity` and `NaN`, which no message to a runner may carry). Walked without
    recursion."""
    stack = [(raw, 1)]
    while stack:
        v, d = stack.pop()
        if d > MAX_SCHEMA_DEPTH:
            raise RequestError(f"`{param}` is nested more than {MAX_SCHEMA_DEPTH} levels deep",
                               param)
        if isinstance(v, float) and not math.isfinite(v):
            raise RequestError(f"`{param}` holds {v}, which is no JSON number", param)
        children = v.values() if isinstance(v, dict) else v if isinstance(v, list) else ()
        stack.extend((x, d + 1) for x in children)
    return raw


def schema(raw: Any, param: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise RequestError(f"`{param}` must be a JSON schema (an object)", param)
    return depth(raw, param)


def tools(raw: Any) -> list[dict[str, Any]]:
    """`tools`: functions with unique names; what the chat template receives."""
    if raw is None:
        return []
    if not isinstance(raw, list) or len(raw) > MAX_TOOLS:
        raise RequestError(f"`tools` must be an array of at most {MAX_TOOLS} tools", "tools")
    out = [tool(t, f"tools[{i}]") for i, t in enumerate(raw)]
    names = [t["function"]["name"] for t in out]
    if len(set(names)) < len(names):
        raise RequestError("`tools`: two tools have the same name", "tools")
    return out


def tool(raw: Any, param: str) -> dict[str, Any]:
    f = raw.get("function") if isinstance(raw, dict) and raw.get("type") == "function" else None
    if not isinstance(f, dict):
        raise RequestError(f'`{param}` must be {{"type": "function", "function": {{...}}}}',
                           param)
    fn: dict[str, Any] = {"name": name(f.get("name"), f"{param}.function.name")}
    if f.get("description") is not None:
        fn["description"] = text_field(f["description"], f"{param}.function.description")
    if f.get("parameters") is not None:
        fn["parameters"] = schema(f["parameters"], f"{param}.function.parameters")
    flag(f.get("strict"), f"{param}.function.strict")
    return {"type": "function", "function": fn}


def text_field(raw: Any, param: str) -> str:
    if not isinstance(raw, str):
        raise RequestError(f"`{param}` must be a string", param)
    return text(raw, param)


def flag(raw: Any, param: str, default: bool = False) -> bool:
    if raw is not None and not isinstance(raw, bool):
        raise RequestError(f"`{param}` must be a boolean", param)
    return default if raw is None else raw


def tool_choice(raw: Any, listed: list[dict[str, Any]]) -> tuple[str, str | None]:
    """("none" | "auto" | "required" | "function", the named function or None)."""
    if raw is None or raw in TOOL_CHOICES:
        choice = raw or "auto"
        if choice == "required" and not listed:
            raise RequestError("`tool_choice` is required but `tools` is empty", "tool_choice")
        return choice, None
    f = raw.get("function") if isinstance(raw, dict) and raw.get("type") == "function" else None
    if not isinstance(f, dict) or not isinstance(f.get("name"), str):
        raise RequestError('`tool_choice` must be "none", "auto", "required" or {"type": '
                           '"function", "function": {"name": ...}}', "tool_choice")
    if f["name"] not in {t["function"]["name"] for t in listed}:
        raise RequestError(f"`tool_choice` names {f['name'][:64]!r}, which is not in `tools`",
                           "tool_choice")
    return "function", f["name"]


def response_format(raw: Any, choice: str) -> dict[str, Any] | None:
    """None (text), {"type": "json_object"}, or {"type": "json_schema", "schema", "strict"}."""
    kind = raw.get("type") if isinstance(raw, dict) else None
    if raw is None or kind == "text":
        return None
    if kind not in ("json_object", "json_schema"):
        raise RequestError('`response_format.type` must be "text", "json_object" or '
                           '"json_schema"', "response_format")
    if choice in ("required", "function"):  # the call's arguments follow the tool's parameters
        raise RequestError("`response_format` cannot be combined with a `tool_choice` that "
                           "forces a tool call", "response_format")
    if kind == "json_object":
        return {"type": "json_object"}
    spec, param = raw.get("json_schema"), "response_format.json_schema"
    if not isinstance(spec, dict):
        raise RequestError(f"`{param}` must be an object with `name` and `schema`", param)
    name(spec.get("name"), f"{param}.name")
    return {"type": "json_schema", "strict": flag(spec.get("strict"), f"{param}.strict"),
            "schema": schema(spec.get("schema", {}), f"{param}.schema")}


def schema_bytes(size: int, limit: int, param: str) -> None:
    """A request's schemas (compact JSON bytes) within the instance's grammar.max_schema_kib."""
    if size > limit:
        raise RequestError(f"`{param}`: the schemas are {size} bytes as compact JSON, more than "
                           f"this instance's grammar.max_schema_kib ({limit >> 10} KiB)", param)


def turn(raw: dict[str, Any], role: str, param: str) -> dict[str, Any]:
    """A message's tool structure, kept for the chat template: an assistant's `tool_calls`, a
    tool message's `tool_call_id`, a `name`."""
    out: dict[str, Any] = {}
    if raw.get("tool_calls") is not None:
        out["tool_calls"] = past_calls(raw["tool_calls"], role, f"{param}.tool_calls")
    call_id = raw.get("tool_call_id")
    if role == "tool" and not (isinstance(call_id, str) and call_id):
        raise RequestError(f"`{param}.tool_call_id` must name the call this message answers",
                           f"{param}.tool_call_id")
    if call_id is not None:
        if role != "tool":
            raise RequestError(f"`{param}.tool_call_id` belongs to a tool message",
                               f"{param}.tool_call_id")
        out["tool_call_id"] = call_id
    if raw.get("name") is not None:
        out["name"] = name(raw["name"], f"{param}.name")
    return out


def past_calls(raw: Any, role: str, param: str) -> list[dict[str, Any]]:
    if role != "assistant":
        raise RequestError(f"`{param}`: only an assistant message has tool calls", param)
    if not isinstance(raw, list) or len(raw) > MAX_TOOLS:
        raise RequestError(f"`{param}` must be an array of at most {MAX_TOOLS} calls", param)
    return [past_call(c, f"{param}[{i}]") for i, c in enumerate(raw)]


def past_call(raw: Any, param: str) -> dict[str, Any]:
    """A call made earlier, as templates take it: arguments as an object (clients send them as
    JSON text, or as the object)."""
    f = raw.get("function") if isinstance(raw, dict) else None
    if not isinstance(f, dict):
        raise RequestError(f'`{param}` must be {{"type": "function", "function": {{"name": '
                           '..., "arguments": ...}}}}', param)
    args, where = f.get("arguments", {}), f"{param}.function.arguments"
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError):
            args = None
    if not isinstance(args, dict):
        raise RequestError(f"`{where}` must be a JSON object (as text or as is)", where)
    out = {"type": "function", "function": {"name": name(f.get("name"), f"{param}.function.name"),
                                            "arguments": depth(args, where)}}
    return {**out, "id": raw["id"]} if isinstance(raw.get("id"), str) else out


# ---- the rest of the sampling set --------------------------------------------------------------
def integer(raw: Any, param: str, default: int, lo: int, hi: int) -> int:
    """An integer field: `default` when not set (None), else an int (not a bool) in range."""
    if raw is None:
        return default
    if isinstance(raw, bool) or not isinstance(raw, int) or not lo <= raw <= hi:
        raise RequestError(f"`{param}` must be an integer from {lo} to {hi}", param)
    return raw


def top_k(raw: Any) -> int:
    """Sample from the k most probable tokens; 0 or -1 (vLLM's spelling): off."""
    return integer(raw, "top_k", 0, -1, MAX_TOP_K)


def repetition_penalty(raw: Any) -> float:
    """A factor dividing (multiplying, when negative) the logits of tokens seen lately; 1: off.
    0 would divide by zero."""
    if raw is None:
        return 1.0
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw) \
            or not 0 < raw <= MAX_REPETITION_PENALTY:
        raise RequestError(f"`repetition_penalty` must be a number more than 0 and at most "
                           f"{MAX_REPETITION_PENALTY:g} (1: off)", "repetition_penalty")
    return float(raw)


def context_size(name: str, raw: Any) -> int:
    """How many of the latest tokens a penalty looks at (one of CONTEXT_SIZES)."""
    return integer(raw, name, DEFAULT_CONTEXT_SIZE, 1, MAX_CONTEXT_SIZE)


# ---- what comes back besides the text ----------------------------------------------------------
def logprobs(raw: Any) -> bool:
    """The chat endpoint's `logprobs`: a boolean."""
    if raw is not None and not isinstance(raw, bool):
        raise RequestError("`logprobs` must be a boolean", "logprobs")
    return bool(raw)


def top_logprobs(raw: Any, with_logprobs: bool) -> int:
    """How many of the most probable tokens come with each token's logprob; needs logprobs."""
    top = integer(raw, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS)
    if raw is not None and not with_logprobs:
        raise RequestError("`top_logprobs` needs `logprobs: true`", "top_logprobs")
    return top


def completion_logprobs(raw: Any) -> int | None:
    """/v1/completions' `logprobs`: how many of the most probable tokens come with each token
    (0: only the token's own); None: no logprobs."""
    if raw is None:
        return None
    return integer(raw, "logprobs", 0, 0, MAX_TOP_LOGPROBS)


def chat_template_kwargs(raw: Any, param: str = "chat_template_kwargs") -> dict[str, Any]:
    """Extra variables for the chat template: names that are variables, not the template
    call's own arguments; plain JSON values, small."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping) or len(raw) > MAX_TEMPLATE_KWARGS:
        raise RequestError(f"`{param}` must be an object of at most {MAX_TEMPLATE_KWARGS} "
                           "variables", param)
    for k in raw:
        if not isinstance(k, str) or not _VARIABLE.fullmatch(k) \
                or k in RESERVED_TEMPLATE_KWARGS:
            raise RequestError(f"`{param}`: {str(k)[:60]!r} is not a template variable (a name "
                               "of letters, digits and _, not an argument of the template call "
                               "itself)", param)
    try:
        size = len(json.dumps(raw, ensure_ascii=False, allow_nan=False))
    except (ValueError, TypeError, RecursionError):
        raise RequestError(f"`{param}` must hold plain JSON values", param) from None
    if size > MAX_TEMPLATE_KWARGS_CHARS:
        raise RequestError(f"`{param}` is more than {MAX_TEMPLATE_KWARGS_CHARS} characters as "
                           "JSON", param)
    return dict(raw)
