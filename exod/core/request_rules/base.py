"""What every rule shares: the error, and the checks of text, names, flags, integers and nested
JSON that fields of every topic use."""

from __future__ import annotations

import math
import re
from typing import Any

MAX_SCHEMA_DEPTH = 64  # nesting of a schema or of a call's arguments
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # OpenAI's rule for function and schema names


class RequestError(Exception):
    """The request cannot be served as given; `param` names the field at fault, for the
    client's error (a 400 from the API, a `bad_request` error event from the runner)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def text(value: str, param: str) -> str:
    """JSON may spell a lone surrogate (`"\\ud800"`), which is no text at all: it cannot be
    encoded for the runner, nor tokenized."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise RequestError(f"`{param}` holds a lone surrogate at character {e.start}, which is "
                           "not text", param) from None
    return value


def name(raw: Any, param: str) -> str:
    if not isinstance(raw, str) or not _NAME.fullmatch(raw):
        raise RequestError(f"`{param}` must be 1 to 64 letters, digits, _ . or -", param)
    return raw


def depth(raw: Any, param: str) -> Any:
    """A JSON value nested at most MAX_SCHEMA_DEPTH deep, its numbers finite (Python's JSON
    reads `Infinity` and `NaN`, which no message to a runner may carry), its strings and keys
    text (no lone surrogate, which no message to a runner can encode). Walked without
    recursion."""
    return _walk(raw, param, MAX_SCHEMA_DEPTH)


def plain(raw: Any, param: str) -> Any:
    """A JSON value exod can write back as it came (what an answer repeats of its request):
    finite numbers and text, as `depth` checks them, nested as deep as the body was."""
    return _walk(raw, param, None)


def _walk(raw: Any, param: str, most: int | None) -> Any:
    stack = [(raw, 1)]
    while stack:
        v, d = stack.pop()
        if most is not None and d > most:
            raise RequestError(f"`{param}` is nested more than {most} levels deep", param)
        if isinstance(v, float) and not math.isfinite(v):
            raise RequestError(f"`{param}` holds {v}, which is no JSON number", param)
        if isinstance(v, str):
            text(v, param)
        elif isinstance(v, dict):
            for key in v:
                text(str(key), param)
        children = v.values() if isinstance(v, dict) else v if isinstance(v, list) else ()
        stack.extend((x, d + 1) for x in children)
    return raw


def text_field(raw: Any, param: str) -> str:
    if not isinstance(raw, str):
        raise RequestError(f"`{param}` must be a string", param)
    return text(raw, param)


def flag(raw: Any, param: str, default: bool = False) -> bool:
    if raw is not None and not isinstance(raw, bool):
        raise RequestError(f"`{param}` must be a boolean", param)
    return default if raw is None else raw


def integer(raw: Any, param: str, default: int, lo: int, hi: int) -> int:
    """An integer field: `default` when not set (None), else an int (not a bool) in range."""
    if raw is None:
        return default
    if isinstance(raw, bool) or not isinstance(raw, int) or not lo <= raw <= hi:
        raise RequestError(f"`{param}` must be an integer from {lo} to {hi}", param)
    return raw


def obj(raw: Any, param: str, what: str = "an object") -> dict[str, Any]:
    """A JSON object (the shape of a dialect's own structure: a block, an item, a tool)."""
    if not isinstance(raw, dict):
        raise RequestError(f"`{param}` must be {what}", param)
    return raw


def array(raw: Any, param: str, most: int | None = None, nonempty: bool = False,
          what: str = "items") -> list[Any]:
    """A JSON array, of at most `most` entries, not empty when `nonempty`."""
    bound = f" of at most {most} {what}" if most is not None else f" of {what}"
    if not isinstance(raw, list) or (most is not None and len(raw) > most) \
            or (nonempty and not raw):
        raise RequestError(f"`{param}` must be {'a non-empty' if nonempty else 'an'} array"
                           f"{bound}", param)
    return raw


def one_of(raw: Any, choices: tuple[str, ...], param: str) -> str:
    """One of a few strings (a list or an object is none of them, and cannot be hashed)."""
    if not isinstance(raw, str) or raw not in choices:
        raise RequestError(f"`{param}` must be one of {', '.join(choices)}", param)
    return raw


def required(raw: Any, param: str) -> Any:
    if raw is None:
        raise RequestError(f"`{param}` is required", param)
    return raw
