"""How a request generates: the body and its plain fields, how many tokens, the sampling set,
and what comes back besides the text."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exod.core.request_rules.base import RequestError, depth, flag, integer, text
from exod.core.text import clip

DEFAULT_MAX_TOKENS_CHAT = 1024
DEFAULT_MAX_TOKENS_COMPLETION = 16  # the OpenAI reference's default for /v1/completions
MAX_STOPS = 16
MAX_STOP_CHARS = 1024
MAX_BIAS = 1024  # entries of logit_bias
BIAS_LIMIT = 100  # a logit_bias value is from -BIAS_LIMIT to BIAS_LIMIT
MAX_TOP_K = (1 << 31) - 1  # top_k at or past the vocabulary keeps every token
MAX_REPETITION_PENALTY = 10.0  # a factor on the logits of tokens seen; 1: off
MAX_CONTEXT_SIZE = 1 << 20  # tokens a penalty looks back on
DEFAULT_CONTEXT_SIZE = 20  # mlx-lm's
CONTEXT_SIZES = ("repetition_context_size", "presence_context_size", "frequency_context_size")
MAX_TOP_LOGPROBS = 20  # OpenAI's limit
MAX_THINK_BUDGET = (1 << 31) - 1  # a bound of the wire, not of a model: max_tokens bounds it
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


def number(name: str, raw: Any, param: str | None = None) -> float:
    """A row of NUMBERS: its default when not set (None), else a finite number in its range;
    `param`: the field as the dialect names it (default `name`)."""
    r = NUMBERS[name]
    param = param or name
    if raw is None:
        return r.default
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw) \
            or not r.lo <= raw <= r.hi:
        raise RequestError(f"`{param}` must be a number from {r.lo:g} to {r.hi:g}", param)
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


def seed(raw: Any, param: str = "seed") -> int | None:
    if raw is not None and (isinstance(raw, bool) or not isinstance(raw, int)):
        raise RequestError(f"`{param}` must be an integer", param)
    return raw


def stream(raw: Any) -> bool:
    if raw is not None and not isinstance(raw, bool):
        raise RequestError("`stream` must be a boolean", "stream")
    return bool(raw)


def stream_options(raw: Any, streaming: bool, param: str = "stream_options") -> bool:
    """Whether the stream ends with a usage chunk. (`include_obfuscation` pads chunks against
    length side channels: it cannot change the answer, and exod's chunks carry no padding.)"""
    if raw is None:
        return False
    if not streaming:
        raise RequestError(f"`{param}` is only allowed when `stream` is true", param)
    if not isinstance(raw, dict):
        raise RequestError(f"`{param}` must be an object", param)
    for key in ("include_usage", "include_obfuscation"):
        flag(raw.get(key), f"{param}.{key}")
    return bool(raw.get("include_usage", False))


def stop(raw: Any, param: str = "stop") -> list[str]:
    if raw is None:
        return []
    stops = [raw] if isinstance(raw, str) else raw
    if not (isinstance(stops, list) and len(stops) <= MAX_STOPS
            and all(isinstance(s, str) for s in stops)):
        raise RequestError(f"`{param}` must be a string or an array of at most {MAX_STOPS} "
                           "strings", param)
    if any(not s for s in stops):
        raise RequestError(f"`{param}` sequences must not be empty", param)
    if any(len(s) > MAX_STOP_CHARS for s in stops):
        raise RequestError(f"`{param}` sequences are at most {MAX_STOP_CHARS} characters",
                           param)
    return [text(s, param) for s in stops]


# ---- how much is generated ---------------------------------------------------------------------
def max_tokens(raw: Any, param: str = "max_tokens", default: int | None = None) -> int:
    """`max_tokens` / `max_completion_tokens`: `default` when not set (None), if there is one."""
    if raw is None and default is not None:
        return default
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        raise RequestError(f"`{param}` must be an integer of at least 1", param)
    return raw


def max_tokens_cap(value: int, context: int | None, cap: int | None) -> int:
    """`max_tokens` within the model's context window and the instance's `max_tokens_cap`
    (None: unknown, or none): a larger value is clamped to them, as llama.cpp clamps to its
    server's limit (agents ask for 32000 whatever the model): the generation then ends there,
    with finish reason `length`. The operator's cap bounds the work; it breaks no client."""
    known = [x for x in (context, cap) if x is not None]
    return min(value, *known) if known else value


def think_budget(raw: Any, param: str = "think_budget") -> int | None:
    """Tokens of reasoning at most (None: as many as the model writes, within max_tokens)."""
    if raw is None:
        return None
    return integer(raw, param, 1, 1, MAX_THINK_BUDGET)


def below(value: int, limit: Any, param: str, limit_param: str) -> int:
    """A number below another field's (which, when it is no integer, its own rule refuses)."""
    if isinstance(limit, int) and not isinstance(limit, bool) and value >= limit:
        raise RequestError(f"`{param}` must be less than `{limit_param}`", param)
    return value


MODEL_WINDOW = "the model's context window"


def fit_window(prompt: int, max_tokens: int, window: int | None, param: str,
               what: str = MODEL_WINDOW) -> int:
    """The tokens a request may generate: no position may pass the model's context window,
    where a learned position table (gpt2's) would be read out of bounds (or the window the
    request asked for: `what` names it). A prompt that fills the window is refused
    (WindowExceeded, with its numbers, which each dialect words as its clients act on); a
    generation that would pass it ends there (finish reason `length`). Nothing is ever cut
    from the prompt to make it fit."""
    if window is None:
        return max_tokens
    if prompt >= window:
        raise WindowExceeded(f"the prompt is {prompt} tokens: it must leave room for one token "
                             f"in {what} of {window}", param, prompt=prompt, window=window,
                             own=what != MODEL_WINDOW)
    return min(max_tokens, window - prompt)


class WindowExceeded(RequestError):
    """A prompt refused by `fit_window`: its length, the window, and whether that window was
    the request's own (Ollama's `num_ctx`) rather than the model's. The runner sends the
    numbers with its error (exod.wire.messages' `Error`), and each dialect words the refusal as its
    clients recognise it (exod.api.window_errors)."""

    def __init__(self, message: str, param: str, *, prompt: int, window: int,
                 own: bool) -> None:
        super().__init__(message, param)
        self.prompt, self.window, self.own = prompt, window, own


def context_window(raw: Any, param: str = "context_window") -> int | None:
    """A request's own context window (Ollama's `num_ctx`), in tokens; None: the model's."""
    if raw is None:
        return None
    return integer(raw, param, 0, 1, MAX_CONTEXT_SIZE << 10)


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
            # Quoted short: the key is the client's, of any length (a 50 KB key was a 50 KB error).
            raise RequestError(f"`logit_bias`: {clip(str(k), 60)!r} is not a token id",
                               "logit_bias")
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


# ---- the rest of the sampling set --------------------------------------------------------------
def top_k(raw: Any, param: str = "top_k") -> int:
    """Sample from the k most probable tokens; 0 or -1 (vLLM's spelling): off."""
    return integer(raw, param, 0, -1, MAX_TOP_K)


def repetition_penalty(raw: Any, param: str = "repetition_penalty") -> float:
    """A factor dividing (multiplying, when negative) the logits of tokens seen lately; 1: off.
    0 would divide by zero."""
    if raw is None:
        return 1.0
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw) \
            or not 0 < raw <= MAX_REPETITION_PENALTY:
        raise RequestError(f"`{param}` must be a number more than 0 and at most "
                           f"{MAX_REPETITION_PENALTY:g} (1: off)", param)
    return float(raw)


def context_size(name: str, raw: Any, param: str | None = None) -> int:
    """How many of the latest tokens a penalty looks at (one of CONTEXT_SIZES)."""
    return integer(raw, param or name, DEFAULT_CONTEXT_SIZE, 1, MAX_CONTEXT_SIZE)


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
    # Nested as deep as a schema at most: the daemon writes the request to the runner by
    # recursion (exod.wire.protocol), which a value 500 lists deep overflowed (a 500).
    depth(dict(raw), param)
    try:
        as_json = json.dumps(raw, ensure_ascii=False, allow_nan=False)
        size = len(as_json)
        as_json.encode()  # a lone surrogate (a UnicodeError: a ValueError) is no text
    except (ValueError, TypeError, RecursionError):
        raise RequestError(f"`{param}` must hold plain JSON values", param) from None
    if size > MAX_TEMPLATE_KWARGS_CHARS:
        raise RequestError(f"`{param}` is more than {MAX_TEMPLATE_KWARGS_CHARS} characters as "
                           "JSON", param)
    return dict(raw)
