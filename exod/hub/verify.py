"""Check cached files against the hub's hashes: SHA-256 for LFS files, the git blob id (SHA-1
of `blob SIZE\\0` and the content) for the others. Pure but for reading the files."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

from exod.hub.cache import FileRecord

CHUNK = 1 << 20


class Hasher:
    """The hub's hash of a file, fed as its bytes come (from the network or from disk)."""

    def __init__(self, rec: FileRecord) -> None:
        self.rec = rec
        if rec.sha256:
            self.h = hashlib.sha256()
        else:
            self.h = hashlib.sha1(usedforsecurity=False)
            self.h.update(f"blob {rec.size}\0".encode())
        self.size = 0

    def update(self, chunk: bytes) -> None:
        self.h.update(chunk)
        self.size += len(chunk)

    def feed(self, path: Path, on_bytes: Callable[[int], None] | None = None) -> None:
        with open(path, "rb") as f:
            while chunk := f.read(CHUNK):
                self.update(chunk)
                if on_bytes is not None:
                    on_bytes(len(chunk))

    @property
    def matches(self) -> bool:
        want = self.rec.sha256 or self.rec.git_sha1
        return self.size == self.rec.size and self.h.hexdigest() == want


def digest(path: Path, rec: FileRecord, on_bytes: Callable[[int], None] | None = None) -> bool:
    """True when `path` holds what the hub says `rec` holds."""
    h = Hasher(rec)
    h.feed(path, on_bytes)
    return h.matches
