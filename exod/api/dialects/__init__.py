"""The API dialects, one package each holding all of it: its table of fields (`fields`, read
by exod.api.fields), the mapping of its body onto the one request (`request`, into
exod.api.request.GenRequest, the core's rules under the client's field names), and its
rendering of the one typed reply (`output`, from exod.api.reply; stop reasons worded by
exod.api.stop_reasons). No dialect has a generation path of its own (exod.api.serving).

    openai      POST /v1/chat/completions, /v1/completions
    anthropic   POST /v1/messages, /v1/messages/count_tokens (Anthropic Messages)
    responses   POST /v1/responses (OpenAI Responses, stateless)
    ollama      Ollama's /api/* (its routes too)
    embeddings  POST /v1/embeddings, /v1/rerank (their answers: exod.api.embedding)

A new dialect is a package: a table (listed in DIALECTS below, for the docs), a request module
that reads a body with a `Reading` of it, an output module, and its routes (exod.api.app).
"""

from exod.api.dialects.anthropic.fields import MESSAGES
from exod.api.dialects.embeddings.fields import EMBEDDINGS, RERANK
from exod.api.dialects.ollama.fields import (OLLAMA_CHAT, OLLAMA_EMBED, OLLAMA_EMBEDDINGS,
                                             OLLAMA_GENERATE, OLLAMA_MANAGE)
from exod.api.dialects.openai.fields import CHAT, COMPLETION
from exod.api.dialects.responses.fields import RESPONSES

# Every dialect's table, in the order docs/api-fields.md shows them (`python -m tests.field_docs`).
DIALECTS = (CHAT, COMPLETION, MESSAGES, RESPONSES, EMBEDDINGS, RERANK, OLLAMA_CHAT,
            OLLAMA_GENERATE, OLLAMA_MANAGE, OLLAMA_EMBED, OLLAMA_EMBEDDINGS)
