"""Text cut to a length, for an error message, a log line or status: the one way exod does it."""

from __future__ import annotations

ELLIPSIS = "…"


def clip(text: str, limit: int, *, flat: bool = False) -> str:
    """`text` whole when it fits in `limit` characters, else its start and an ellipsis, `limit`
    in all. `flat`: every run of whitespace first becomes one space (one line, e.g. of a
    library's multi-line error)."""
    if flat:
        text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + ELLIPSIS
