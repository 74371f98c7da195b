"""OpenAI chat completions and completions: the field tables (`fields`), the bodies onto the
one request (`request`), the answers (`objects`, `output`)."""
