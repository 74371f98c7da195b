"""Named API keys (local stand-in of the KEYS helper's module, replaced at merge)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Scope = Literal["infer", "manage", "admin"]
Priority = Literal["interactive", "batch"]


@dataclass(frozen=True)
class KeyLimits:
    in_flight: int | None = None
    prompt_tokens_per_minute: int | None = None
    completion_tokens_per_minute: int | None = None
    tokens_per_day: int | None = None
    tokens_per_month: int | None = None


@dataclass(frozen=True)
class ApiKey:
    name: str
    owner: str = ""
    scopes: frozenset[str] = frozenset({"infer", "manage", "admin"})
    instances: frozenset[str] | None = None
    limits: KeyLimits = KeyLimits()
    weight: float = 1.0
    priority: str = "interactive"


ANONYMOUS = ApiKey("anonymous")
