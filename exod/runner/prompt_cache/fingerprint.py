"""What makes a stored KV cache valid, as one name: the fingerprint of a disk entry's folder.
It covers the weights by content (the SHA-256 of every file mlx-lm reads, the adapter's too),
the settings that change the numbers, the rank's place in its group, exod's cache format and
the mlx and mlx-lm versions (docs/prompt-cache.md, "Never a wrong answer").

Hashing every byte of a model costs a read of it, so each file's hash is recorded with the
file's identity: device, inode, size, mtime and ctime, in nanoseconds. Any write to a file
changes its mtime and ctime, a file put in its place has another inode or ctime, and no program
can set a ctime (only the kernel does, to now), so a file whose identity is the recorded one
still has the recorded content. As git's index does, a hash taken within `RACY` seconds of the
file's last change is not trusted again (a write in the same clock tick leaves the times as they
were). The record sits beside the files when they are plain files in a writable folder (shared
by every instance of that model), else in the disk tier's own folder (a hub snapshot's files
are links into huggingface_hub's blobs, a folder exod leaves alone).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from exod import cache_files
from exod.paths import PRIVATE, make_dirs

FORMAT_VERSION = 1  # exod's disk entries; a new layout is a new number
RECORD = ".exod-weights.json"
RACY = 2.0
HASH_CHUNK = 16 << 20


class HashingStopped(Exception):
    """Hashing was interrupted (the runner is stopping)."""


def weight_files(model: Path, adapters: Path | None) -> dict[str, Path]:
    """The files whose content is the model, by a name that does not depend on where they are."""
    files = {f"model/{p.name}": p for p in sorted(model.glob("model*.safetensors"))}
    files["model/config.json"] = model / "config.json"
    if adapters is not None:
        for name in ("adapter_config.json", "adapters.safetensors"):
            files[f"adapters/{name}"] = adapters / name
    return files


def fingerprint(parts: Mapping[str, object]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def identity(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


class Records:
    """Recorded hashes, by real path: beside the files when writable, else in `fallback`."""

    def __init__(self, fallback: Path) -> None:
        self.fallback = fallback
        self._read: dict[Path, dict[str, Any]] = {}  # record file → its content
        self._dirty: set[Path] = set()

    def lookup(self, path: Path, real: Path, st: os.stat_result) -> str | None:
        for record in (*self._beside(path), self.fallback):
            got = self._load(record).get(str(real))
            if isinstance(got, dict) and got.get("id") == identity(st) \
                    and isinstance(got.get("sha256"), str) \
                    and got.get("at_ns", 0) - max(st.st_mtime_ns, st.st_ctime_ns) > RACY * 1e9:
                return str(got["sha256"])
        return None

    def put(self, path: Path, real: Path, st: os.stat_result, sha: str, at_ns: int) -> None:
        beside = self._beside(path)
        record = beside[0] if beside and os.access(path.parent, os.W_OK) else self.fallback
        self._load(record)[str(real)] = {"id": identity(st), "sha256": sha, "at_ns": at_ns}
        self._dirty.add(record)

    def save(self) -> None:
        """Write what changed (a record that cannot be written is just hashed again later)."""
        for record in self._dirty:
            for target in (record, self.fallback):
                try:
                    _write_json(target, {**self._load(target), **self._read[record]})
                    break
                except OSError:
                    continue
        self._dirty.clear()

    @staticmethod
    def _beside(path: Path) -> list[Path]:
        return [] if path.is_symlink() else [path.parent / RECORD]

    def _load(self, record: Path) -> dict[str, Any]:
        if record not in self._read:
            try:  # a FIFO or a link in its place is not read: the next save replaces it
                got = json.loads(cache_files.read_regular(record, 64 << 20))
            except (OSError, ValueError):
                got = {}
            self._read[record] = got if isinstance(got, dict) else {}
        return self._read[record]


def digest(files: Mapping[str, Path], records: Records,
           should_stop: Callable[[], bool] = lambda: False) -> tuple[str, int]:
    """One hash of every file's content (a missing file is part of it), and the bytes that had
    to be read for it (0 when every hash was recorded)."""
    h, read = hashlib.sha256(), 0
    for name, path in sorted(files.items()):
        try:
            real = path.resolve(strict=True)
            st = os.stat(real)
        except OSError:
            h.update(f"{name}:missing\n".encode())
            continue
        sha = records.lookup(path, real, st)
        if sha is None:
            at_ns = time.time_ns()
            sha = _hash_file(real, should_stop)
            read += st.st_size
            records.put(path, real, st, sha, at_ns)
        h.update(f"{name}:{sha}\n".encode())
    records.save()
    return h.hexdigest(), read


def _hash_file(path: Path, should_stop: Callable[[], bool]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK):
            if should_stop():
                raise HashingStopped
            h.update(chunk)
    return h.hexdigest()


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    make_dirs(path.parent, PRIVATE)  # the instance's folder (a model's exists: left as it is)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        tmp.write_text(json.dumps(obj))
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def to_hash(files: Mapping[str, Path], records: Records) -> int:
    """Bytes `digest` would have to read (0: every hash is recorded, the digest is instant)."""
    total = 0
    for path in files.values():
        try:
            real = path.resolve(strict=True)
            st = os.stat(real)
        except OSError:
            continue
        if records.lookup(path, real, st) is None:
            total += st.st_size
    return total
