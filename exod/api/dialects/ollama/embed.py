"""Ollama's embeddings endpoints onto the one embeddings request: `POST /api/embed` (`input`: a
string or strings, `truncate`, `dimensions`) and the older `POST /api/embeddings` (one
`prompt`). Each body is read against its table (exod.api.dialects.ollama.fields) and checked
by the same rules as `/v1/embeddings`, under Ollama's field names; the answers are Ollama's objects.

Ollama gives /api/embed's vectors of length 1 whatever the model's files say (and /api/embeddings'
as the model makes them), so `embed_answer` normalizes each vector; the statistics are in
nanoseconds, as Ollama's are: `load_duration` is the wait before the runner took the request
(its queue, and an on-demand instance's load).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from exod.api.dialects.embeddings.request import EmbedRequest, embed_request
from exod.api.dialects.ollama.fields import OLLAMA_EMBED, OLLAMA_EMBEDDINGS
from exod.api.fields import Reading
from exod.api.request import http
from exod.core import keep_alive as keep
from exod.core import request_rules as rules

if TYPE_CHECKING:
    from exod.api.embedding import Embedded


@dataclass(frozen=True)
class OllamaEmbed:
    """A checked Ollama embeddings request: what the one path serves, and what only Ollama's
    answer needs."""

    req: EmbedRequest
    legacy: bool  # /api/embeddings: one prompt, answered `{embedding}`
    keep_alive: float | None = None  # seconds (math.inf: keep), None: not asked


@http
def parse(raw: Any, legacy: bool = False, strict: bool = False) -> OllamaEmbed:
    """An /api/embed body (legacy: an /api/embeddings body), or a RequestError naming the
    field."""
    r = Reading(OLLAMA_EMBEDDINGS if legacy else OLLAMA_EMBED, strict)
    b = rules.body(raw)
    r.keys(b, "body")
    dialect = "ollama_embeddings" if legacy else "ollama_embed"
    if legacy:
        prompt = b.get("prompt")
        if not isinstance(prompt, str):
            raise rules.RequestError("`prompt` must be a string", "prompt")
        req = embed_request(b.get("model"), prompt, dialect=dialect, param="prompt",
                            ignored=r.ignored)
    else:
        inputs = b.get("input")
        if isinstance(inputs, list) and inputs and not isinstance(inputs[0], str):
            raise rules.RequestError("`input` must be a string or an array of strings", "input")
        truncate = b.get("truncate")
        if truncate is not None and not isinstance(truncate, bool):
            raise rules.RequestError("`truncate` must be true or false", "truncate")
        req = embed_request(b.get("model"), inputs, truncate=truncate,
                            dimensions=b.get("dimensions"), dialect=dialect, param="input",
                            ignored=r.ignored)
    return OllamaEmbed(req, legacy, keep.parse(b.get("keep_alive")))


def unit(vector: list[float]) -> list[float]:
    """The vector scaled to length 1 (a zero vector as it is)."""
    norm = math.hypot(*vector)
    return [x / norm for x in vector] if norm > 0 else vector


def embed_answer(view: OllamaEmbed, got: Embedded, total_ns: int) -> dict[str, Any]:
    """/api/embed's answer (`total_ns`: since the request arrived); /api/embeddings' is
    `{embedding}`."""
    if view.legacy:
        return {"embedding": got.floats(0)}
    return {"model": view.req.model,
            "embeddings": [unit(got.floats(i)) for i in range(len(got.results))],
            "total_duration": total_ns, "load_duration": min(got.waited_ns, total_ns),
            "prompt_eval_count": got.prompt_tokens}
