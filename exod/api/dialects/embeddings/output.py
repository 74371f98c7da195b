"""OpenAI's embeddings object and the Jina/Cohere rerank object, written from what the runner
gave (exod.api.embedding.Embedded)."""

from __future__ import annotations

import base64
import uuid
from typing import TYPE_CHECKING, Any

from exod.api.dialects.embeddings.request import EmbedRequest

if TYPE_CHECKING:
    from exod.api.embedding import Embedded


def openai_embeddings(req: EmbedRequest, got: Embedded) -> dict[str, Any]:
    """OpenAI's embeddings list."""
    def vector(i: int) -> Any:
        if req.encoding_format == "base64":
            return base64.b64encode(got.results[i]).decode()
        return got.floats(i)

    return {"object": "list", "model": req.model,
            "data": [{"object": "embedding", "index": i, "embedding": vector(i)}
                     for i in range(len(got.results))],
            "usage": {"prompt_tokens": got.prompt_tokens, "total_tokens": got.prompt_tokens}}


def rerank_answer(req: EmbedRequest, got: Embedded) -> dict[str, Any]:
    """The Jina/Cohere rerank object: results best first (ties in the documents' order)."""
    scores = [got.score(i) for i in range(len(got.results))]
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:req.top_n or None]
    results = []
    for i in order:
        result: dict[str, Any] = {"index": i, "relevance_score": scores[i]}
        if req.return_documents:
            doc = req.documents[i]
            result["document"] = {"text": doc} if isinstance(doc, str) else doc
        results.append(result)
    return {"id": f"rerank-{uuid.uuid4().hex}", "object": "list", "model": req.model,
            "results": results,
            "usage": {"prompt_tokens": got.prompt_tokens, "total_tokens": got.prompt_tokens}}
