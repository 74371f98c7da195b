"""The API dialects other than OpenAI's chat completions and completions (exod.api.request):
each maps its request body onto the one request the core serves (exod.api.request.GenRequest:
its table of fields in exod.api.fields, the core's rules under the client's own field names),
and renders what the core renders (OpenAI's chat completion object, or its chunks) in its own
shape (`Output`). No dialect has a generation path of its own: batching, the prompt cache,
tools, constrained decoding, hang detection and the ladder are the one path's.

    anthropic   POST /v1/messages, /v1/messages/count_tokens (Anthropic Messages)
    responses   POST /v1/responses (OpenAI Responses, stateless)

A new dialect is a table (exod.api.fields), a request module that reads a body with a
`Reading` of that table into a GenRequest, an output module, and its routes (exod.api.app).
"""
