"""Ollama's API on exod's own listener (`/`, `/api/*`), for the apps that speak only it
(Copilot's and Raycast's Ollama providers, Open WebUI, n8n...).

    objects   what /api/version, /api/tags, /api/show and /api/ps answer (pure)
    manage    the routes: the read-only ones, /api/pull, /api/delete, /api/embed*
    generate  /api/chat and /api/generate, a dialect like the others
              (exod.api.dialects.ollama.request, ollama_output; its field table
              exod.api.dialects.ollama.fields), and their loads and unloads (keep_alive)
 Errors are Ollama's `{"error": TEXT}`
(exod.api.middleware.error_response), with the same statuses as the other dialects'.
"""
