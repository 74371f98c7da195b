"""Named API keys: who a request is (`ApiKey`), what it may do (its scopes and instances) and
what it may use (its limits, weight and priority); how a key's secret is made, stored (only
its hash) and matched against what a client offers (`Keyring`). Pure: the config declares
keys, the API resolves each request's to one of these, and the daemon and runner read it.

Secrets are made here (`new_secret`: 256 random bits), never chosen by people, so a fast hash
is right: nobody can search a space of 2^256 by guessing, however fast each guess is, and a
slow password hash (scrypt, argon2) would cost every request milliseconds for nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from exod.core.kinds import doc

Scope = Literal["infer", "manage", "admin"]
Priority = Literal["interactive", "batch"]
SCOPES: tuple[Scope, ...] = ("infer", "manage", "admin")

NAME_RE = r"^[A-Za-z0-9._-]{1,64}$"
HASH_PREFIX = "sha256:"
HASH_RE = r"^sha256:[0-9a-f]{64}$"
SECRET_PREFIX = "exod-"  # lets secret scanners (and people) tell an exod key when they see one


@dataclass(frozen=True)
class KeyLimits:
    """What one key may use; None: no limit. Declared once here, for the config's schema (its
    `doc` metadata is the operator's documentation) and for whoever enforces them."""

    in_flight: int | None = field(default=None, metadata=doc(
        "Requests of this key in flight at once (generating or waiting in a queue); one more "
        "gets 429 with `Retry-After`.", minimum=1))
    prompt_tokens_per_minute: int | None = field(default=None, metadata=doc(
        "Prompt tokens a minute.", minimum=1))
    completion_tokens_per_minute: int | None = field(default=None, metadata=doc(
        "Completion (generated) tokens a minute.", minimum=1))
    tokens_per_day: int | None = field(default=None, metadata=doc(
        "Prompt and completion tokens together, a calendar day (UTC).", minimum=1))
    tokens_per_month: int | None = field(default=None, metadata=doc(
        "Prompt and completion tokens together, a calendar month (UTC).", minimum=1))


@dataclass(frozen=True)
class ApiKey:
    name: str  # the operator's; "token" for api.token_file's, "anonymous" with no auth at all
    owner: str = ""
    scopes: frozenset[str] = frozenset(SCOPES)
    instances: frozenset[str] | None = None  # None: every instance
    limits: KeyLimits = KeyLimits()
    weight: float = 1.0
    priority: str = "interactive"  # a Priority

    def may(self, scope: str) -> bool:
        """Whether the key holds `scope` (`admin` holds every scope)."""
        return scope in self.scopes or "admin" in self.scopes

    def sees(self, instance: str) -> bool:
        """Whether the key may use (and be shown) the instance named so."""
        return self.instances is None or instance in self.instances


ANONYMOUS = ApiKey("anonymous")
TOKEN = ApiKey("token")  # every token of api.token_file: every scope, every instance


def new_secret() -> str:
    """A fresh secret: 256 random bits, URL-safe text, with exod's prefix."""
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def digest(secret: bytes) -> bytes:
    return hashlib.sha256(secret).digest()


def hash_text(secret: str | bytes) -> str:
    """What the config stores of a secret: `sha256:HEX`."""
    raw = secret.encode() if isinstance(secret, str) else secret
    return HASH_PREFIX + digest(raw).hex()


def digest_of(text: str) -> bytes:
    """The digest a `sha256:HEX` (validated by the config) stands for."""
    return bytes.fromhex(text.removeprefix(HASH_PREFIX))


class Keyring:
    """Every secret the API accepts, by its digest, and the key each one is. `match` hashes
    what a client offers and compares it with every digest, each in constant time and with no
    early exit, so the time it takes says nothing of which digest came close. The digest a
    request matched is its identity: a reload that drops it revokes it (exod.api.live)."""

    def __init__(self, keys: Iterable[tuple[bytes, ApiKey]] = (), auth: bool = False) -> None:
        self.entries = list(keys)
        # No key and no token configured: the API has no auth, every request is ANONYMOUS.
        self.auth = auth or bool(self.entries)

    def match(self, offered: bytes) -> tuple[bytes, ApiKey] | None:
        got = digest(offered)
        found: tuple[bytes, ApiKey] | None = None
        for d, key in self.entries:
            if hmac.compare_digest(got, d) and found is None:
                found = (d, key)
        return found

    def identities(self) -> set[bytes]:
        """The digests requests may hold now (ANONYMOUS's, b"", when there is no auth)."""
        return {d for d, _ in self.entries} if self.auth else {b""}
