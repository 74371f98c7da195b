"""OpenAI Responses, stateless: the field table (`fields`), the body onto the one request
(`request`), the answers (`output`)."""
