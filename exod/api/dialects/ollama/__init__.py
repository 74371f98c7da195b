"""Ollama's API on exod's own listener (`/`, `/api/*`), for the apps that speak only it
(Copilot's and Raycast's Ollama providers, Open WebUI, n8n...).

    fields    its field tables
    request   /api/chat's and /api/generate's bodies onto the one request
    output    their answers, from the one typed reply (NDJSON, Ollama's statistics)
    generate  the routes /api/chat and /api/generate, and their loads and unloads (keep_alive)
    embed     /api/embed's and /api/embeddings' bodies and answers
    objects   what /api/version, /api/tags, /api/show and /api/ps answer (pure)
    manage    the routes: the read-only ones, /api/pull, /api/delete, /api/embed*
    host      what these routes need of the HTTP server

Errors are Ollama's `{"error": TEXT}` (exod.api.middleware.error_response), with the same
statuses as the other dialects'.
"""
