"""Counts read back from answers, as each dialect defines them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def prompt_of(usage: Any) -> int:
    """The prompt's tokens from an Anthropic `usage` (the SDK's object, or its JSON): its
    `input_tokens` are those not read from the prompt cache, so the prompt is them plus
    `cache_read_input_tokens` (and the creation count, which exod leaves at 0)."""
    def get(key: str) -> int:
        value = usage.get(key) if isinstance(usage, Mapping) else getattr(usage, key, None)
        return int(value or 0)
    return get("input_tokens") + get("cache_read_input_tokens") + \
        get("cache_creation_input_tokens")
