"""A request's inputs as the model takes them: token ids (and, for a reranker's query and
document pairs, token type ids), with the length rule applied. Runs on the reader's thread, off
the serve loop (exod.runner.serving.reading): no mlx here.

The tokenizer is called as sentence-transformers and mlx-vlm's server call it (special tokens
added; a pair for a reranker), so the same text gives the same tokens. An input past the
model's length is cut to it (the tokenizer's own truncation, which keeps the end marker) or
refused, as the request says. A text is first cut to a prefix of PREFIX_CHARS characters per
token the model takes, so a 10 MB string costs the tokenizer a few kilobytes: a prefix that
already gives more tokens than the model takes decides; one that gives fewer is doubled until
it decides or the whole text has been read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from exod.wire import messages as m
from exod.facts.embed import Encoding
from exod.core.request_rules import RequestError
from exod.core.request_rules import embeddings as rules

PREFIX_CHARS = 16  # characters per token of a first prefix (text averages 3 to 5)
MARGIN = 8  # tokens past the length that make a prefix's count decisive (the cut word)


@dataclass(frozen=True)
class Inputs:
    """What the engine runs for one request: each input's token ids (its pair's type ids for a
    reranker, or None), and their count."""

    ids: list[list[int]]
    types: list[list[int]] | None
    tokens: int


def read_inputs(tokenizer: Any, enc: Encoding, vocab: int, req: m.Embed) -> Inputs:
    """RequestError naming the field (`input[3]`, `dimensions`) when it cannot be served."""
    if req.kind != enc.role:
        raise RequestError(wrong_kind(enc), req.named("texts"))
    if req.dimensions is not None:
        why = enc.cut(req.dimensions)
        if why is not None:
            raise RequestError(f"`dimensions` {req.dimensions}: {why}", "dimensions")
    most = enc.max_tokens

    def name(i: int) -> str:  # the client's name of input i: `input[3]`, or `input` alone
        return req.named(f"texts[{i}]") if f"texts[{i}]" in req.names \
            else f"{req.named('texts')}[{i}]"

    if req.tokens:
        ids = [_given(t, vocab, most, req.truncate, name(i)) for i, t in enumerate(req.tokens)]
        return Inputs(ids, None, sum(map(len, ids)))
    if req.query is not None:
        return _pairs(tokenizer, req.query, req.texts, most, req.truncate, name)
    ids = _texts(tokenizer, req.texts, most, req.truncate, name)
    return Inputs(ids, None, sum(map(len, ids)))


def wrong_kind(enc: Encoding) -> str:
    return ("this instance is a reranker: send a query and documents to /v1/rerank"
            if enc.role == "rerank" else
            "this instance is an embedding model: send inputs to /v1/embeddings (reranking "
            "needs a cross-encoder reranker)")


def _given(ids: list[int], vocab: int, most: int, truncate: bool, param: str) -> list[int]:
    """Token ids sent as they are: no special token is added."""
    rules.token_ids(ids, vocab, param)
    if len(ids) <= most:
        return ids
    if not truncate:
        raise rules.too_long(param, len(ids), most)
    return ids[:most]


Encoded = list[tuple[list[int], list[int] | None]]  # (ids, type ids) of each text


Name = Callable[[int], str]  # an input's field, as the client named it


def _texts(tokenizer: Any, texts: list[str], most: int, truncate: bool,
           name: Name) -> list[list[int]]:
    def encode(batch: list[str], cut: bool) -> Encoded:
        kw = {"truncation": True, "max_length": most} if cut else {}
        out = tokenizer(batch, add_special_tokens=True, **kw)["input_ids"]
        return [(ids, None) for ids in out]

    return [ids for ids, _ in _decide(encode, texts, most, truncate, name)]


def _pairs(tokenizer: Any, query: str, docs: list[str], most: int, truncate: bool,
           name: Name) -> Inputs:
    """The query with each document, as one sequence each (a cross-encoder's input); cut as
    the tokenizer cuts a pair (the longer of the two first)."""
    head = query[:(most + MARGIN) * PREFIX_CHARS]  # read with every document: bounded once
    if len(head) < len(query) and not truncate:
        raise rules.too_long("query", most + MARGIN, most)

    def encode(batch: list[str], cut: bool) -> Encoded:
        kw = {"truncation": True, "max_length": most} if cut else {}
        out = tokenizer([head] * len(batch), batch, add_special_tokens=True, **kw)
        types = out.get("token_type_ids") or [None] * len(batch)
        return list(zip(out["input_ids"], types, strict=True))

    pairs = _decide(encode, docs, most, truncate, name)
    ids = [i for i, _ in pairs]
    types = [t if t is not None else [0] * len(i) for i, t in pairs] \
        if any(t is not None for _, t in pairs) else None
    return Inputs(ids, types, sum(map(len, ids)))


def _decide(encode: Callable[[list[str], bool], Encoded], texts: list[str], most: int,
            truncate: bool, name: Name) -> Encoded:
    """Each text's ids within `most` tokens, reading as little of a long text as decides."""
    out: list[tuple[list[int], list[int] | None] | None] = [None] * len(texts)
    limit = [(most + MARGIN) * PREFIX_CHARS] * len(texts)
    todo = list(range(len(texts)))
    while todo:
        heads = [texts[i][:limit[i]] for i in todo]
        over: list[int] = []
        again: list[int] = []
        for i, head, got in zip(todo, heads, encode(heads, False), strict=True):
            whole = len(head) == len(texts[i])
            n = len(got[0])
            if n <= most and whole:
                out[i] = got
            elif n > most + (0 if whole else MARGIN):
                if not truncate:
                    raise rules.too_long(name(i), n, most)
                over.append(i)
            else:  # the prefix did not decide: read twice as much
                limit[i] *= 2
                again.append(i)
        if over:
            cut = encode([texts[i][:limit[i]] for i in over], True)
            for i, got in zip(over, cut, strict=True):
                out[i] = got
        todo = again
    return [got for got in out if got is not None]
