"""Embeddings and rerank bodies onto the one request the runner takes (`m.Embed`), with what
only HTTP needs beside it (`EmbedRequest`). Each field is read against its dialect's table
(exod.api.dialects.embeddings.fields) and checked by its rule (exod.core.request_rules.embeddings).

Another dialect (Ollama's /api/embed and /api/embeddings) maps its body with `embed_request`,
then serves it with exod.api.embedding.Embedder.run, as these two endpoints do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from exod.wire import messages as m
from exod.api.dialects.embeddings.fields import EMBEDDINGS, RERANK
from exod.api.fields import Reading
from exod.api.request import http
from exod.core import request_rules as rules
from exod.core.request_rules import embeddings as embed_rules


@dataclass(frozen=True)
class EmbedRequest:
    """A checked embeddings or rerank request: what the runner receives, and what only HTTP
    needs to answer it."""

    embed: m.Embed  # its id is set by the link
    model: str
    dialect: str  # as /metrics labels what it ignored
    encoding_format: str = "float"  # embeddings: how vectors are written
    top_n: int = 0  # rerank: the best this many (0: all)
    return_documents: bool = False
    documents: tuple[Any, ...] = ()  # rerank: as sent, for return_documents
    ignored: tuple[str, ...] = ()  # as GenRequest.ignored


def embed_request(model: Any, inputs: Any, *, truncate: Any = None, dimensions: Any = None,
                  dialect: str = "embeddings", param: str = "input",
                  ignored: tuple[str, ...] = ()) -> EmbedRequest:
    """The request for `inputs` (a string, strings, token ids or arrays of them), each value
    checked by its rule (RequestError naming the field, `param` for the inputs: a dialect's
    own name for them). For a dialect of its own (Ollama's /api/embed): map its body's
    fields here, then `Embedder.run`."""
    texts, tokens = embed_rules.inputs(inputs, param)
    names = {"texts": param}
    if isinstance(inputs, str) or (tokens and not isinstance(inputs[0], list)):
        names["texts[0]"] = param  # one input, not a list of them
    embed = m.Embed(id="", kind="embed", texts=texts, tokens=tokens,
                    truncate=embed_rules.truncate(truncate),
                    dimensions=embed_rules.dimensions(dimensions), names=names)
    return EmbedRequest(embed, rules.model(model), dialect, ignored=ignored)


@http
def parse_embeddings(raw: Any, strict: bool = False) -> EmbedRequest:
    r = Reading(EMBEDDINGS, strict)
    b = rules.body(raw)
    r.keys(b, "body")
    req = embed_request(b.get("model"), b.get("input"), truncate=b.get("truncate"),
                        dimensions=b.get("dimensions"), ignored=r.ignored)
    return EmbedRequest(req.embed, req.model, "embeddings",
                        encoding_format=embed_rules.encoding_format(b.get("encoding_format")),
                        ignored=r.ignored)


@http
def parse_rerank(raw: Any, strict: bool = False) -> EmbedRequest:
    r = Reading(RERANK, strict)
    b = rules.body(raw)
    r.keys(b, "body")
    model = rules.model(b.get("model"))
    query = embed_rules.query(b.get("query"))
    docs = embed_rules.documents(b.get("documents"))
    embed = m.Embed(id="", kind="rerank", texts=docs, query=query,
                    truncate=embed_rules.truncate(b.get("truncate")),
                    names={"texts": "documents"})
    return EmbedRequest(embed, model, "rerank", top_n=embed_rules.top_n(b.get("top_n"),
                                                                         len(docs)),
                        return_documents=rules.flag(b.get("return_documents"),
                                                    "return_documents"),
                        documents=tuple(b["documents"]), ignored=r.ignored)
