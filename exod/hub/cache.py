"""huggingface_hub's cache layout, read and written with plain file operations.

`CACHE/models--ORG--NAME/{blobs/HASH, refs/REVISION, snapshots/COMMIT/FILE → ../../blobs/HASH}`.
exod adds one record per snapshot it fetched, `exod/COMMIT.json`: the files a runner needs with
the hub's hashes, and the size and mtime each had when its hash was last checked, so a start from
the cache costs a few stat() calls, not a read of every byte. The daemon uses this module (it
never imports huggingface_hub); huggingface_hub itself ignores the extra folder.

A repository's folders are real folders: one that is a link (`models--ORG--NAME` pointing out
of the cache), a file or a FIFO is never followed nor written through; it is not cached, the
fetcher refuses it with the reason, and `exoctl rm` removes the link itself (exod.cache_files).
Folders exod makes here are 0755 whatever the umask (exod.paths.make_dirs).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exod import cache_files
from exod.core.hub_ref import COMMIT_RE, HubRef
from exod.paths import READABLE, SYSTEM_STATE, make_dirs, user_cache

REPO_FOLDERS = ("blobs", "refs", "snapshots", "exod")


def default_cache(env: Mapping[str, str], euid: int) -> Path:
    """huggingface_hub's own variables first (HF_HUB_CACHE, then HF_HOME: whoever sets one, root
    in a terminal too, means it, as huggingface_hub reads them); else a service with a state
    directory (systemd's StateDirectory=, root's /var/lib/exod) keeps its own cache there; a
    user's exod shares the user's huggingface_hub cache, so what mlx-lm already downloaded is
    not fetched twice."""
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"])
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]) / "hub"
    state = env.get("STATE_DIRECTORY")
    if state:
        return Path(state.split(":")[0]) / "hub"
    if euid == 0:
        return SYSTEM_STATE / "hub"
    return user_cache(env) / "huggingface" / "hub"


@dataclass(frozen=True)
class FileRecord:
    size: int
    blob: str  # the blob's name in the cache: the hub's ETag ("": a plain file, no blob)
    sha256: str = ""  # LFS files
    git_sha1: str = ""  # the others: the git blob id

    @property
    def hashed(self) -> bool:
        """The hub's hash is known. A plain file of a snapshot someone else made, read with no
        hub to ask, has none: it is taken as it is, as mlx-lm would load it."""
        return bool(self.sha256 or self.git_sha1)


@dataclass
class Manifest:
    commit: str
    files: dict[str, FileRecord]
    checked: dict[str, tuple[int, int]] = field(default_factory=dict)  # path → (size, mtime_ns)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files.values())

    def to_json(self) -> dict[str, Any]:
        return {"commit": self.commit,
                "files": {p: vars(f) for p, f in sorted(self.files.items())},
                "checked": {p: list(v) for p, v in sorted(self.checked.items())}}

    @staticmethod
    def from_json(data: Any) -> Manifest:
        files = {str(p): FileRecord(**f) for p, f in data["files"].items()}
        checked = {str(p): (int(v[0]), int(v[1])) for p, v in data.get("checked", {}).items()}
        return Manifest(str(data["commit"]), files, checked)


@dataclass(frozen=True)
class Cached:
    """A snapshot of a repository in the cache, with everything a runner needs."""

    path: Path
    commit: str
    size: int
    checked: bool  # every file is as it was when its hash was last checked


def repo_dir(cache: Path, ref: HubRef) -> Path:
    return cache / ref.folder


def manifest_path(cache: Path, ref: HubRef, commit: str) -> Path:
    return repo_dir(cache, ref) / "exod" / f"{commit}.json"


def snapshot_dir(cache: Path, ref: HubRef, commit: str) -> Path:
    return repo_dir(cache, ref) / "snapshots" / commit


def repo_problem(cache: Path, ref: HubRef, commit: str | None = None) -> str | None:
    """Why `ref`'s folder in the cache (or one of its own folders) is not one exod reads or
    writes: a link, a file, a FIFO where a folder should be. None when each is a real folder,
    or missing."""
    repo = repo_dir(cache, ref)
    inside = [repo / name for name in REPO_FOLDERS]
    if commit is not None:
        inside.append(snapshot_dir(cache, ref, commit))
    for folder in (repo, *inside):
        try:
            why = cache_files.strange(folder, want_folder=True)
        except OSError as e:
            return f"{folder} cannot be read ({e.strerror or e})"
        if why is not None:
            return (f"{folder} is {why}: exod neither reads nor writes a repository through "
                    f"it (remove it: `exoctl rm hf:{ref.repo}`)")
    return None


def commit_of(cache: Path, ref: HubRef) -> str | None:
    """The commit the cache holds for `ref`'s revision (a branch or tag is read from refs/)."""
    if ref.pinned:
        return ref.revision
    try:
        raw = cache_files.read_regular(repo_dir(cache, ref) / "refs" / ref.revision, 4096)
        text = raw.decode().strip()
    except (OSError, ValueError):
        return None
    return text if COMMIT_RE.fullmatch(text) else None


def write_ref(cache: Path, ref: HubRef, commit: str) -> None:
    if ref.pinned:
        return
    path = repo_dir(cache, ref) / "refs" / ref.revision
    make_dirs(path.parent, READABLE)
    tmp = path.with_name(path.name + ".exod-tmp")
    tmp.write_text(commit)
    os.replace(tmp, path)


def read_manifest(cache: Path, ref: HubRef, commit: str) -> Manifest | None:
    try:
        raw = cache_files.read_regular(manifest_path(cache, ref, commit), 64 << 20)
        return Manifest.from_json(json.loads(raw))
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None


def write_manifest(cache: Path, ref: HubRef, manifest: Manifest) -> None:
    path = manifest_path(cache, ref, manifest.commit)
    make_dirs(path.parent, READABLE)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(manifest.to_json(), indent=1))
    os.replace(tmp, path)


def stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()  # follows the snapshot's symlink to the blob
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def cached(cache: Path, ref: HubRef) -> Cached | None:
    """The complete snapshot of `ref` in the cache, or None (never fetched, or files missing)."""
    commit = commit_of(cache, ref)
    if commit is None or repo_problem(cache, ref, commit) is not None:
        return None
    manifest = read_manifest(cache, ref, commit)
    if manifest is None:
        return None
    snap = snapshot_dir(cache, ref, commit)
    checked = True
    for name, rec in manifest.files.items():
        now = stamp(snap / name)
        if now is None or now[0] != rec.size:
            return None
        checked = checked and manifest.checked.get(name) == now
    return Cached(snap, commit, manifest.size, checked)


def touch(cache: Path, ref: HubRef, commit: str) -> None:
    """An instance starts from this snapshot: its record's time is its last use."""
    try:
        os.utime(manifest_path(cache, ref, commit))
    except OSError:
        pass  # a read-only cache: the last use stays the last fetch


@dataclass(frozen=True)
class CachedRepo:
    """One repository in the cache, as `exoctl models` lists it."""

    repo: str
    revisions: dict[str, str]  # ref → commit
    commits: tuple[str, ...]
    size: int  # bytes of its blobs, partial downloads included
    partial: int  # bytes of unfinished downloads
    last_use: float | None = None  # when exod last fetched it or started from it (epoch s)
    problem: str = ""  # what is strange about it (a link, not followed); nothing else was read


def _last_use(folder: Path) -> float | None:
    try:
        return max((p.lstat().st_mtime for p in (folder / "exod").glob("*.json")),
                   default=None)
    except OSError:
        return None


def _blob_sizes(folder: Path) -> tuple[int, int]:
    """(bytes, of which partial): the blobs, and the files of a snapshot made of plain files
    instead of links into blobs/ (a cache copied with its links followed)."""
    total = partial = 0
    try:
        blobs = list((folder / "blobs").iterdir())
    except OSError:
        blobs = []
    try:
        plain = [p for p in (folder / "snapshots").rglob("*") if p.is_file() and
                 not p.is_symlink()]
    except OSError:
        plain = []
    for blob in blobs + plain:
        try:
            st = blob.lstat()  # a blob that is a link is not followed: it counts nothing
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        total += st.st_size
        if blob.name.endswith(".incomplete"):
            partial += st.st_size
    return total, partial


def entries(cache: Path) -> list[CachedRepo]:
    try:
        folders = sorted(p for p in cache.iterdir() if p.name.startswith("models--"))
    except OSError:
        return []
    out = []
    for folder in folders:
        repo = folder.name.removeprefix("models--").replace("--", "/", 1)
        why = repo_problem(cache, HubRef(repo))
        if why is not None:
            out.append(CachedRepo(repo, {}, (), 0, 0, None, problem=why))
            continue
        revisions: dict[str, str] = {}
        refs = folder / "refs"
        if refs.is_dir():
            for ref in sorted(refs.rglob("*")):
                try:
                    text = cache_files.read_regular(ref, 4096).decode().strip()
                except (OSError, ValueError):
                    continue  # a folder (refs/pr/), or something that is not a ref
                revisions[str(ref.relative_to(refs))] = text
        try:
            commits = tuple(sorted(p.name for p in (folder / "snapshots").iterdir()))
        except OSError:
            commits = ()
        size, partial = _blob_sizes(folder)
        out.append(CachedRepo(repo, revisions, commits, size, partial, _last_use(folder)))
    return out


def remove(cache: Path, ref: HubRef) -> cache_files.Removal:
    """Delete a repository from the cache, whatever stands at its name: a link is removed as a
    link (never followed), a file or a FIFO as a file. The Removal says what was done; nothing
    was there when it found nothing."""
    return cache_files.remove(repo_dir(cache, ref))


def partial_bytes(cache: Path, ref: HubRef, blobs: Mapping[str, int]) -> int:
    """Bytes of `blobs` (name → size) already on disk, whole or in part."""
    base = repo_dir(cache, ref) / "blobs"
    done = 0
    for blob, size in blobs.items():
        for name in (blob, blob + ".incomplete"):
            try:
                done += min(size, (base / name).stat().st_size)
                break
            except OSError:
                continue
    return done
