"""What exod does with each field of each dialect's request bodies, as data (one table per
dialect: exod.api.fields.chat, .messages, .responses, .embeddings, .ollama), the `Reading` that
applies a table to a body (exod.api.fields.policy); docs/api-fields.md is rendered from the tables
(`python -m tests.field_docs`).
Adding a dialect is a table here and a mapping module in exod.api.dialects."""

from exod.api.fields.chat import CHAT, COMPLETION
from exod.api.fields.embeddings import EMBEDDINGS, OLLAMA_EMBED, OLLAMA_EMBEDDINGS, RERANK
from exod.api.fields.messages import MESSAGES
from exod.api.fields.ollama import OLLAMA_CHAT, OLLAMA_GENERATE, OLLAMA_MANAGE
from exod.api.fields.policy import Dialect, Field, Kind, Obj, Reading, Variants, template
from exod.api.fields.responses import RESPONSES

DIALECTS = (CHAT, COMPLETION, MESSAGES, RESPONSES, EMBEDDINGS, RERANK, OLLAMA_CHAT,
            OLLAMA_GENERATE, OLLAMA_MANAGE, OLLAMA_EMBED, OLLAMA_EMBEDDINGS)

__all__ = ["CHAT", "COMPLETION", "DIALECTS", "Dialect", "EMBEDDINGS", "Field", "Kind",
           "MESSAGES", "OLLAMA_CHAT", "OLLAMA_EMBED", "OLLAMA_EMBEDDINGS", "OLLAMA_GENERATE",
           "OLLAMA_MANAGE", "Obj", "RERANK", "RESPONSES", "Reading", "Variants", "template"]
