"""The API dialects other than OpenAI Chat Completions, as thin adapters over its core.

Each dialect translates its request into a chat completions body, which `exod.api.schema`
checks like any other (so every rule, limit and guard applies), and translates what the core
renders (OpenAI's chat completion object, or its chunks) back into its own shape (`Output`).
No dialect has a generation path of its own: batching, the prompt cache, tools, constrained
decoding, hang detection and the ladder are the chat path's.

    anthropic   POST /v1/messages, /v1/messages/count_tokens (Anthropic Messages)
    responses   POST /v1/responses (OpenAI Responses, stateless)
"""
