"""A hub snapshot written straight into a cache folder, as exod's fetcher leaves one: weights as
LFS blobs named by their SHA-256, the other files as git blobs named by their git blob id, the
snapshot's links into blobs/, refs/main, and exod's record with the hub's hashes. What a node
holds when it fetched a model from the hub, with no hub needed to make it."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from exod.core.hub_ref import make
from exod.hub import cache as hc

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def record(name: str, data: bytes) -> hc.FileRecord:
    if name.endswith(".safetensors"):
        sha = hashlib.sha256(data).hexdigest()
        return hc.FileRecord(len(data), sha, sha256=sha)
    git = hashlib.sha1(f"blob {len(data)}\0".encode() + data, usedforsecurity=False).hexdigest()
    return hc.FileRecord(len(data), git, git_sha1=git)


def fill(cache: Path, repo: str, files: dict[str, bytes], commit: str = COMMIT) -> Path:
    """`files` as `repo`'s snapshot at `commit` (revision main); the snapshot's folder."""
    ref = make(repo, "main")
    blobs = hc.repo_dir(cache, ref) / "blobs"
    snap = hc.snapshot_dir(cache, ref, commit)
    blobs.mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True, exist_ok=True)
    manifest = hc.Manifest(commit, {})
    for name, data in files.items():
        rec = manifest.files[name] = record(name, data)
        (blobs / rec.blob).write_bytes(data)
        os.symlink(os.path.relpath(blobs / rec.blob, snap), snap / name)
        stamp = hc.stamp(snap / name)
        assert stamp is not None
        manifest.checked[name] = stamp
    hc.write_manifest(cache, ref, manifest)
    hc.write_ref(cache, ref, commit)
    return snap


def fill_from(cache: Path, repo: str, model_dir: Path, commit: str = COMMIT) -> Path:
    """A model folder's files (those a runner needs) as `repo`'s snapshot."""
    from exod.hub.files import wanted

    return fill(cache, repo, {p.name: p.read_bytes() for p in sorted(model_dir.iterdir())
                              if p.is_file() and wanted(p.name)}, commit)


def flip(snap: Path, name: str) -> None:
    """One byte of `name`'s blob changed, its size kept (a disk's or a peer's corruption)."""
    blob = (snap / name).resolve()
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0x01
    blob.write_bytes(bytes(data))
