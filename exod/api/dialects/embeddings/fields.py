"""OpenAI embeddings (`POST /v1/embeddings`) and the Jina/Cohere rerank shape (`POST
/v1/rerank`): what exod does with each field (the rules are exod.core.request_rules.embeddings;
the mapping is exod.api.dialects.embeddings.request)."""

from __future__ import annotations

from exod.api.fields import Dialect, Obj, inert, null, refused, works
from exod.core.request_rules import embeddings as rules

TRUNCATE = works("an input longer than the model takes: `true` (default) or `\"END\"` cuts "
                 "it to the model's length, `false` or `\"NONE\"` refuses it (a 400 naming "
                 "it)")
MODEL = works("the instance that answers")
PROMPTS = refused("instruction prompts are not applied: put the model's prompt in the text "
                  "(e.g. `query: ...`)", null, "refused unless null")

EMBEDDINGS = Dialect("embeddings", "POST /v1/embeddings", intro=(
    "Served by an instance whose model is an embedding model (docs/embeddings.md): a chat "
    "model's instance answers 400, naming what it serves. The answer is OpenAI's list of "
    "`{object: embedding, index, embedding}` with `usage`."), objects={
    "body": Obj("", {
        "model": MODEL,
        "input": works(f"a string, an array of strings, an array of token ids, or an array of "
                       f"such arrays: at most {rules.MAX_INPUTS} inputs; token ids are taken "
                       "as they are (no special token added)"),
        "encoding_format": works("`float` (default) or `base64` (float32, little-endian)"),
        "dimensions": works("vectors cut to this size, then normalized again: only for a model "
                            "trained for it (its config.json's `matryoshka_dimensions`), else "
                            "a 400 naming it"),
        "truncate": TRUNCATE,
        "user": inert("who the user is"),
        "input_type": PROMPTS,
        "prompt_name": PROMPTS,
    }),
})

RERANK = Dialect("rerank", "POST /v1/rerank", intro=(
    "Served by an instance whose model is a cross-encoder reranker (docs/embeddings.md). The "
    "answer: `results`, best first, each `{index, relevance_score}` (a score from 0 to 1), "
    "with `document` when asked; and `usage`."), objects={
    "body": Obj("", {
        "model": MODEL,
        "query": works("the text each document is scored against"),
        "documents": works(f"strings, or objects with a `text` (at most "
                           f"{rules.MAX_DOCUMENTS})"),
        "top_n": works("the best this many come back (default: all)"),
        "return_documents": works("`true`: each result carries its `document` (`{text}` for a "
                                  "string, else the object as sent)"),
        "truncate": TRUNCATE,
        "max_tokens_per_doc": refused("it is not supported: each query and document pair is "
                                      "cut to the model's length (`truncate`)", null,
                                      "refused unless null"),
        "rank_fields": refused("a document's fields are not ranked apart: send its text", null,
                               "refused unless null"),
        "instruction": refused("instructions are for generative rerankers, which exod does "
                               "not serve", null, "refused unless null"),
        "user": inert("who the user is"),
    }),
})
