"""What an embeddings or a rerank request is made of: the inputs (texts or token ids), the
query and its documents, how an input longer than the model takes is treated, the size of the
vectors and how they come back. The daemon checks each field here; the runner checks the
inputs again against the model as loaded (its vocabulary, its longest input)."""

from __future__ import annotations

from typing import Any

from exod.core.request_rules.base import RequestError, flag, integer, text

MAX_INPUTS = 2048  # inputs of one embeddings request (OpenAI's limit)
MAX_DOCUMENTS = 1000  # documents of one rerank request (Cohere's recommended bound)
MAX_DIMENSIONS = 1 << 16
MAX_TOKEN_ID = (1 << 31) - 1  # a bound of the wire; the runner checks the vocabulary
DEFAULT_TRUNCATE = True  # an input past the model's length is cut to it (Ollama's default)
ENCODINGS = ("float", "base64")


def inputs(raw: Any, param: str = "input") -> tuple[list[str], list[list[int]]]:
    """`input`: a string, a list of strings, a list of token ids (one input), or a list of such
    lists: (texts, token lists), one of them empty. Refused before any is read when there are
    more than MAX_INPUTS."""
    if isinstance(raw, str):
        return [_text(raw, param)], []
    if not isinstance(raw, list) or not raw:
        raise RequestError(f"`{param}` must be a string, or a non-empty array of strings or of "
                           "token ids", param)
    if len(raw) > MAX_INPUTS:
        raise RequestError(f"`{param}` holds {len(raw)} inputs, more than the {MAX_INPUTS} one "
                           "request may hold", param)
    first = raw[0]
    if isinstance(first, str):
        return [_text(v, f"{param}[{i}]") if isinstance(v, str) else _mixed(param, i)
                for i, v in enumerate(raw)], []
    if _is_id(first):
        return [], [_ids(raw, param)]
    if isinstance(first, list):
        return [], [_ids(v, f"{param}[{i}]") if isinstance(v, list) else _mixed(param, i)
                    for i, v in enumerate(raw)]
    raise RequestError(f"`{param}[0]` must be a string, a token id or an array of token ids",
                       f"{param}[0]")


def _mixed(param: str, i: int) -> Any:
    raise RequestError(f"`{param}[{i}]` is not of the kind of `{param}[0]`: the inputs are "
                       "all strings or all token arrays", f"{param}[{i}]")


def _text(raw: str, param: str) -> str:
    if not raw:
        raise RequestError(f"`{param}` is an empty string, which has no meaning to embed",
                           param)
    return text(raw, param)


def _is_id(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _ids(raw: list[Any], param: str) -> list[int]:
    if not raw:
        raise RequestError(f"`{param}` is an empty array of token ids", param)
    for v in raw:
        if not _is_id(v) or not 0 <= v <= MAX_TOKEN_ID:
            raise RequestError(f"`{param}` must hold token ids (integers from 0)", param)
    return raw


def token_ids(ids: list[int], vocab: int, param: str) -> None:
    """Token ids given as an input: each must index the model's embedding table."""
    bad = next((i for i in ids if not 0 <= i < vocab), None)
    if bad is not None:
        raise RequestError(f"`{param}` holds token id {bad}, outside the model's vocabulary "
                           f"(ids 0 to {vocab - 1})", param)


def encoding_format(raw: Any) -> str:
    if raw is None:
        return "float"
    if raw not in ENCODINGS:
        raise RequestError("`encoding_format` must be float or base64", "encoding_format")
    return str(raw)


def dimensions(raw: Any) -> int | None:
    """The size the vectors are cut to (None: the model's own); whether the model was trained
    for it is the runner's rule (exod.facts.embed.Encoding.cut)."""
    if raw is None:
        return None
    return integer(raw, "dimensions", 0, 1, MAX_DIMENSIONS)


def truncate(raw: Any, param: str = "truncate") -> bool:
    """Whether an input longer than the model takes is cut to its length (true, Cohere's "END")
    or refused (false, "NONE"). Default DEFAULT_TRUNCATE."""
    if isinstance(raw, str):
        if raw.upper() == "END":
            return True
        if raw.upper() == "NONE":
            return False
        raise RequestError(f"`{param}` must be true, false, \"END\" or \"NONE\" (an input is "
                           "cut at its end, never its start)", param)
    return flag(raw, param, DEFAULT_TRUNCATE)


def too_long(param: str, tokens: int, most: int) -> RequestError:
    """An input past the model's length, with truncation off."""
    return RequestError(f"`{param}` is {tokens} tokens or more, more than the {most} the model "
                        "takes (send `truncate: true` to cut it)", param)


def query(raw: Any) -> str:
    if not isinstance(raw, str) or not raw:
        raise RequestError("`query` must be a non-empty string", "query")
    return text(raw, "query")


def document(raw: Any, param: str) -> str:
    """A document: a string, or an object with a `text` (Jina's and Cohere's shape)."""
    if isinstance(raw, dict):
        raw = raw.get("text")
        param = f"{param}.text"
    if not isinstance(raw, str) or not raw:
        raise RequestError(f"`{param}` must be a non-empty string", param)
    return text(raw, param)


def documents(raw: Any) -> list[str]:
    if not isinstance(raw, list) or not raw:
        raise RequestError("`documents` must be a non-empty array", "documents")
    if len(raw) > MAX_DOCUMENTS:
        raise RequestError(f"`documents` holds {len(raw)} documents, more than the "
                           f"{MAX_DOCUMENTS} one request may hold", "documents")
    return [document(d, f"documents[{i}]") for i, d in enumerate(raw)]


def top_n(raw: Any, count: int) -> int:
    """How many results come back, best first (default: all)."""
    return min(count, integer(raw, "top_n", count, 1, MAX_DOCUMENTS))
