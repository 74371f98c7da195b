"""Every dialect's table of fields, in the order docs/api-fields.md shows them
(`python -m tests.field_docs`); each table lives beside its dialect's mapping."""

from exod.api.dialects.anthropic.fields import MESSAGES
from exod.api.dialects.embeddings.fields import EMBEDDINGS, RERANK
from exod.api.dialects.ollama.fields import (OLLAMA_CHAT, OLLAMA_EMBED, OLLAMA_EMBEDDINGS,
                                             OLLAMA_GENERATE, OLLAMA_MANAGE)
from exod.api.dialects.openai.fields import CHAT, COMPLETION
from exod.api.dialects.responses.fields import RESPONSES

DIALECTS = (CHAT, COMPLETION, MESSAGES, RESPONSES, EMBEDDINGS, RERANK, OLLAMA_CHAT,
            OLLAMA_GENERATE, OLLAMA_MANAGE, OLLAMA_EMBED, OLLAMA_EMBEDDINGS)
