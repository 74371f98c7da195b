"""The entries of one tier of the prompt cache, matched against a prompt by their tokens.

Pure (no mlx, no I/O): an entry is its tokens, its size in bytes, whether its cache can be
trimmed to a shorter prefix, and a payload the tier keeps (a cache in RAM, a file name on disk).
Tokens are compared in full, as bytes (`pack`); the hash of an entry's tokens (`key_of`) only
names it, never decides a match.

How an entry serves a prompt (as mlx-lm's LRUPromptCache does): an entry whose tokens are a
prefix of the prompt covers them all; one that goes past the prompt, or equals it, must be
trimmed back to the common prefix, and to one token short of the whole prompt (its last token
must run, for its logits), which only a trimmable cache allows (a hybrid model's recurrent
state cannot be rewound). The best match covers the most tokens; among equals, the one with the
least to trim, then the most recently used. Least recently used entries leave first past the
tier's budget in bytes; a pinned entry (being read) never leaves, and a trimmable entry makes
those whose tokens are a prefix of its own redundant.
"""

from __future__ import annotations

import collections
import hashlib
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

TOKEN_BYTES = 4  # tokens packed as uint32, native order: compared as bytes


ITEM = array("I").itemsize  # bytes a packed token takes


def pack(tokens: Sequence[int]) -> bytes:
    return array("I", tokens).tobytes()


def unpack(packed: bytes) -> list[int]:
    a = array("I")
    a.frombytes(packed)
    return a.tolist()


def key_of(packed: bytes) -> str:
    """An entry's name: a hash of its tokens (names a file; never decides a match)."""
    return hashlib.blake2b(packed, digest_size=16).hexdigest()


def common_prefix(a: bytes, b: bytes) -> int:
    """Tokens two packed sequences share from their start: a binary search over slices, each
    compared at memcmp speed."""
    lo, hi = 0, min(len(a), len(b)) // TOKEN_BYTES
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[: mid * TOKEN_BYTES] == b[: mid * TOKEN_BYTES]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(eq=False)
class Entry:
    tokens: bytes  # packed (see `pack`)
    nbytes: int
    trimmable: bool
    payload: Any = None
    key: str = ""
    pins: int = 0  # readers under way: never evicted meanwhile

    def __post_init__(self) -> None:
        if not self.key:
            self.key = key_of(self.tokens)

    @property
    def length(self) -> int:
        return len(self.tokens) // TOKEN_BYTES


@dataclass(frozen=True)
class Match:
    entry: Entry
    usable: int  # prompt tokens it covers, once trimmed
    trim: int  # tokens to trim off its cache first

    @property
    def rest(self) -> int:
        """Where the prompt's tokens still to prefill start."""
        return self.usable


def usable(entry: Entry, prompt: bytes) -> Match | None:
    """How much of `prompt` (packed) `entry` covers, and what it must trim; None: nothing."""
    n, p = entry.length, len(prompt) // TOKEN_BYTES
    shared = common_prefix(entry.tokens, prompt)
    if shared == n < p:
        return Match(entry, n, 0) if n > 0 else None
    if not entry.trimmable:
        return None
    cover = min(shared, p - 1)
    return Match(entry, cover, n - cover) if cover > 0 else None


@dataclass
class Removed:
    """What an `add` took out: entries made redundant by the new one (or replaced by it),
    and entries evicted for the budget (the new one among them when it alone is too big)."""

    redundant: list[Entry] = field(default_factory=list)
    evicted: list[Entry] = field(default_factory=list)


class Index:
    """One tier's entries, least recently used first."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._entries: collections.OrderedDict[str, Entry] = collections.OrderedDict()
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Entry]:
        """Least recently used first."""
        return iter(list(self._entries.values()))

    def get(self, key: str) -> Entry | None:
        return self._entries.get(key)

    def best(self, prompt: bytes) -> Match | None:
        best: Match | None = None
        for entry in self._entries.values():  # least recently used first: ties go to later
            m = usable(entry, prompt)
            if m is not None and (best is None
                                  or (m.usable, -m.trim) >= (best.usable, -best.trim)):
                best = m
        return best

    def covered(self, tokens: bytes) -> bool:
        """Whether an entry serves everything `tokens` would: the same tokens, or a
        trimmable entry that goes on past them."""
        return any(e.tokens == tokens or (e.trimmable and e.tokens.startswith(tokens))
                   for e in self._entries.values())

    def touch(self, entry: Entry) -> None:
        if entry.key in self._entries:
            self._entries.move_to_end(entry.key)

    def add(self, entry: Entry) -> Removed:
        """Add `entry` (unless one already held serves all it would: then it comes back as
        redundant), taking out what it makes redundant and what the budget evicts."""
        out = Removed()
        if entry.nbytes > self.budget:  # alone past the budget: it would only evict the rest
            out.evicted.append(entry)
            return out
        if any(e.trimmable and e.length > entry.length and e.tokens.startswith(entry.tokens)
               for e in self._entries.values()):
            out.redundant.append(entry)
            return out
        old = self._entries.pop(entry.key, None)
        if old is not None:
            self.nbytes -= old.nbytes
            out.redundant.append(old)
        if entry.trimmable:
            for other in list(self._entries.values()):
                if other.pins == 0 and other.length < entry.length \
                        and entry.tokens.startswith(other.tokens):
                    self._drop(other)
                    out.redundant.append(other)
        self._entries[entry.key] = entry
        self.nbytes += entry.nbytes
        out.evicted = self.fit(self.budget)
        return out

    def remove(self, key: str) -> Entry | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._drop(entry)
        return entry

    def fit(self, budget: int, count: int | None = None) -> list[Entry]:
        """Evict least recently used entries (never a pinned one) until the tier holds at most
        `budget` bytes and, when given, `count` entries."""
        out: list[Entry] = []
        for entry in list(self._entries.values()):
            if self.nbytes <= budget and (count is None or len(self._entries) <= count):
                break
            if entry.pins == 0:
                self._drop(entry)
                out.append(entry)
        return out

    def clear(self) -> list[Entry]:
        gone = [e for e in self._entries.values() if e.pins == 0]
        for e in gone:
            self._drop(e)
        return gone

    def _drop(self, entry: Entry) -> None:
        del self._entries[entry.key]
        self.nbytes -= entry.nbytes
