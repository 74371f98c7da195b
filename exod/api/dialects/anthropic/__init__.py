"""Anthropic Messages: the field table (`fields`), the bodies onto the one request (`request`),
the answers and count_tokens (`output`)."""
