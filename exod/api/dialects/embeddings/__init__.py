"""OpenAI embeddings and rerank: the field tables (`fields`) and the bodies onto the one
embeddings request (`request`); served and answered by exod.api.embedding."""
