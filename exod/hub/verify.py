"""Check cached files against the hub's hashes: SHA-256 for LFS files, the git blob id (SHA-1
of `blob SIZE\\0` and the content) for the others. Pure but for reading the files."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

from exod.hub.cache import FileRecord

CHUNK = 1 << 20


def digest(path: Path, rec: FileRecord, on_bytes: Callable[[int], None] | None = None) -> bool:
    """True when `path` holds what the hub says `rec` holds."""
    if rec.sha256:
        h = hashlib.sha256()
        want = rec.sha256
    else:
        h = hashlib.sha1(usedforsecurity=False)
        h.update(f"blob {rec.size}\0".encode())
        want = rec.git_sha1
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
            if on_bytes is not None:
                on_bytes(len(chunk))
    return size == rec.size and h.hexdigest() == want
