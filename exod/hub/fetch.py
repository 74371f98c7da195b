"""Fetch one repository's snapshot into the cache: the body of `python -m exod.hub`.

The only module of exod that imports huggingface_hub (and only in this process: the daemon
never blocks on the network). Steps: resolve the revision to a commit (or use the one the cache
holds), list the files a runner needs with their sizes and hashes, check free disk against what
is still missing, download (huggingface_hub resumes partial files), check every file against the
hub's hashes (a bad one is fetched again, once), record the snapshot, say `Fetched`.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exod.wire import messages as m
from exod.core.exits import EXIT_TEMPFAIL, EXIT_UNAVAILABLE
from exod.core.file_peers import PeerSource
from exod.hub import cache as hc
from exod.hub.files import disk_problem, wanted
from exod.wire.child_end import ChildEnd
from exod.core.hub_ref import HubRef
from exod.hub.verify import Hasher, digest
from exod.paths import READABLE, make_dirs
from exod.wire.specs import FetchSpec, Planned

TICK = 0.5  # seconds between two progress reports while bytes arrive
CHUNK = 1 << 16
READ_TIMEOUT = 60.0  # no byte for this long: a network error (the daemon retries with backoff)


class FetchRefused(Exception):
    """Retrying will not help (not found, no access, offline and not cached, disk too small).
    So is the hub unreachable before any byte (`unreachable`): retried only when asked."""


@dataclass
class FetchJob:
    ref: HubRef
    cache: Path
    offline: bool
    token: str | bool  # False: no token at all (not even one huggingface_hub finds by itself)
    commit: str | None  # the cache's commit for the revision: used as is, no lookup
    link: ChildEnd[FetchSpec]  # to the daemon (or `exod check`), started by the caller
    peers: tuple[PeerSource, ...] = ()  # cluster peers to ask first (exod.hub.from_peers)
    cluster_key: bytes = b""

    def status(self, text: str) -> None:
        self.link.send(m.Status(phase=m.Phase.STARTING, text=text))


def record(f: Any) -> hc.FileRecord:
    """A huggingface_hub RepoFile as exod records it: the blob is named by the hub's ETag."""
    if f.lfs is not None:
        return hc.FileRecord(f.size, f.lfs.sha256, sha256=f.lfs.sha256)
    return hc.FileRecord(f.size, f.blob_id, git_sha1=f.blob_id)


def from_blobs(job: FetchJob, commit: str) -> hc.Manifest | None:
    """A snapshot fetched by someone else (mlx-lm): its blobs are named by their hashes. One
    made of plain files instead of links (a cache copied with its links followed, or a file
    system without links) has no hash to tell: its files are taken as they are."""
    snap = hc.snapshot_dir(job.cache, job.ref, commit)
    files: dict[str, hc.FileRecord] = {}
    try:
        names = sorted(p.name for p in snap.iterdir() if wanted(p.name))
        for name in names:
            size = (snap / name).stat().st_size
            if not (snap / name).is_symlink():
                files[name] = hc.FileRecord(size, "")
                continue
            blob = os.path.basename(os.readlink(snap / name))
            if len(blob) == 64:
                files[name] = hc.FileRecord(size, blob, sha256=blob)
            elif len(blob) == 40:
                files[name] = hc.FileRecord(size, blob, git_sha1=blob)
            else:
                return None
    except OSError:
        return None
    return hc.Manifest(commit, files) if files else None


def plan(job: FetchJob) -> hc.Manifest:
    """The files to have, with the hub's hashes: from exod's record, else from the hub."""
    strange = hc.repo_problem(job.cache, job.ref, job.commit)
    if strange is not None:  # e.g. a link out of the cache: never read through, nor written
        raise FetchRefused(strange)
    commit = job.commit
    if commit is not None:
        known = hc.read_manifest(job.cache, job.ref, commit)
        if known is not None and (job.offline or all(r.hashed for r in known.files.values())):
            return known
        if known is not None:  # plain files taken as they were: the hub's hashes now
            try:
                return ask_hub(job, commit)
            except Exception as e:
                if not cannot_connect(e):
                    raise
                return known
    if job.offline:
        found = from_blobs(job, commit) if commit is not None else None
        if found is None:
            raise FetchRefused(f"{job.ref} is not in the cache at {job.cache}, and exod is offline")
        return found
    try:
        return ask_hub(job, commit)
    except Exception as e:
        # No network: a snapshot someone else fetched (mlx-lm) starts as it would offline.
        found = from_blobs(job, commit) if commit is not None and cannot_connect(e) else None
        if found is None:
            raise
        job.status(f"the hub cannot be reached: using the cached snapshot of {job.ref}")
        return found


def ask_hub(job: FetchJob, commit: str | None) -> hc.Manifest:
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    api = HfApi(token=job.token)
    job.status(f"looking up {job.ref}")
    # Asked first even for a known commit: it fails at once with no network, where the tree's
    # listing below retries for ~23 s (huggingface_hub's http_backoff).
    info = api.repo_info(job.ref.repo, revision=commit or job.ref.revision)
    commit = commit or (job.ref.revision if job.ref.pinned else info.sha)
    assert commit is not None
    tree = api.list_repo_tree(job.ref.repo, revision=commit, recursive=True)
    files = {f.path: record(f) for f in tree if isinstance(f, RepoFile) and wanted(f.path)}
    if not files:
        raise FetchRefused(f"{job.ref} has no model files (weights, config, tokenizer)")
    return hc.Manifest(commit, files)


def cannot_connect(e: BaseException) -> bool:
    """No connection to the hub could be made (no network or name resolution, refused, timed
    out while connecting): not an error once bytes flow. Matched by class name, through the
    causes: huggingface_hub raises its HTTP client's errors (httpx's, or httpx2's) as they are."""
    seen: BaseException | None = e
    for _ in range(5):
        if seen is None:
            return False
        if {c.__name__ for c in type(seen).__mro__} & {"ConnectError", "ConnectTimeout"}:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def begun(job: FetchJob) -> bool:
    """A download of this repository is under way: a partial file waits to be resumed (each is
    made before its first request)."""
    try:
        return any((hc.repo_dir(job.cache, job.ref) / "blobs").glob("*.incomplete"))
    except OSError:
        return False


def unreachable(job: FetchJob, e: Exception, where: bool = True) -> str | None:
    """With no network, a model not in the cache fails at once, saying why (`exoctl start` or a
    reload tries again); a download under way is retried with backoff, as an outage may pass."""
    if not cannot_connect(e) or begun(job):
        return None
    from huggingface_hub import constants

    first = (str(e).strip().splitlines() or [""])[0]
    why = f"the hub at {constants.ENDPOINT} cannot be reached ({type(e).__name__}: {first})"
    if not where:
        return why
    return why + ("; the cached copy is unchanged" if hc.cached(job.cache, job.ref) else
                  f"; not in the cache at {job.cache}")


def free_space(path: Path) -> int:
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


class BytesReporter:
    """A thread that sums the bytes on disk and reports them while they change."""

    def __init__(self, job: FetchJob, manifest: hc.Manifest) -> None:
        self.job, self.manifest = job, manifest
        self.blobs = {r.blob: r.size for r in manifest.files.values()}
        self._stop = threading.Event()
        self._last = -1
        self.source = ""  # a cluster peer's name while its bytes come

    def tick(self) -> None:
        done = min(hc.partial_bytes(self.job.cache, self.job.ref, self.blobs), self.manifest.size)
        if done != self._last:
            self._last = done
            self.job.link.send(m.DownloadProgress(done=done, total=self.manifest.size,
                                                  source=self.source))

    def __enter__(self) -> BytesReporter:
        self.tick()
        threading.Thread(target=self._run, name="exod-hub-progress", daemon=True).start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(TICK):
            self.tick()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.tick()


def download(job: FetchJob, manifest: hc.Manifest) -> None:
    snap = hc.snapshot_dir(job.cache, job.ref, manifest.commit)
    missing = sorted((n for n in manifest.files if not (snap / n).exists()),
                     key=lambda n: manifest.files[n].size)
    if not missing:
        return
    if job.offline or not all(manifest.files[n].hashed for n in missing):
        why = "exod is offline" if job.offline else "the hub cannot be reached"
        raise FetchRefused(f"{job.ref} is only partly in the cache at {job.cache}, and {why}")
    need = manifest.size - hc.partial_bytes(job.cache, job.ref,
                                            {r.blob: r.size for r in manifest.files.values()})
    problem = disk_problem(str(job.ref), need, free_space(job.cache), str(job.cache))
    if problem:
        raise FetchRefused(problem)
    with BytesReporter(job, manifest):
        for name in missing:
            good = fetch_file(job, manifest.commit, name, manifest.files[name])
            if good:  # hashed as it came: no second read of the file
                stamp = hc.stamp(snap / name)
                if stamp is not None:
                    manifest.checked[name] = stamp


# Appends to a partial file what follows its first bytes: (job, commit, name, part, have, hasher).
Getter = Callable[[FetchJob, str, str, Path, int, Hasher], None]


def fetch_file(job: FetchJob, commit: str, name: str, rec: hc.FileRecord,
               getter: Getter | None = None) -> bool | None:
    """One file into `blobs/ETAG` and its link in the snapshot, resuming `ETAG.incomplete`;
    whether it matches the hub's hash (hashed as it is written), None if not fetched here.

    huggingface_hub's own download starts every process on a fresh temporary file, so a
    download stopped (or killed) midway would start again from its first byte: exod keeps one
    partial file per blob and asks the hub for the rest (an HTTP Range request); `getter` asks
    another source (a cluster peer: exod.hub.from_peers) instead."""
    blobs = hc.repo_dir(job.cache, job.ref) / "blobs"
    make_dirs(blobs, READABLE)
    blob, part = blobs / rec.blob, blobs / f"{rec.blob}.incomplete"
    good = None
    if not blob.exists():
        part.touch()  # before the first request: see `begun`
        hasher = Hasher(rec)
        have = part.stat().st_size if part.exists() else 0
        if have > rec.size:
            part.unlink()
            have = 0
        if have:
            hasher.feed(part)
        if have < rec.size:
            (getter or get_rest)(job, commit, name, part, have, hasher)
        good = hasher.matches
        os.replace(part, blob)
    link = hc.snapshot_dir(job.cache, job.ref, commit) / name
    make_dirs(link.parent, READABLE)
    if not link.exists():
        if link.is_symlink():
            link.unlink()
        os.symlink(os.path.relpath(blob, link.parent), link)
    return good


def get_rest(job: FetchJob, commit: str, name: str, part: Path, have: int, hasher: Hasher) -> None:
    """Append to `part` what follows its first `have` bytes."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    headers = build_hf_headers(token=job.token)
    if have:
        headers["Range"] = f"bytes={have}-"
    url = hf_hub_url(job.ref.repo, name, revision=commit)
    with get_session().stream("GET", url, headers=headers, follow_redirects=True,
                              timeout=READ_TIMEOUT) as r:
        if r.status_code >= 400:
            r.read()
            hf_raise_for_status(r)
        # 206: the rest, after what is on disk. 200: a server that ignores ranges sends it
        # all again; what is on disk is kept, and only what follows written.
        skip = have if r.status_code == 200 else 0
        with open(part, "ab") as f:
            for chunk in r.iter_bytes(CHUNK):
                if skip:
                    cut = min(skip, len(chunk))
                    chunk, skip = chunk[cut:], skip - cut
                f.write(chunk)
                hasher.update(chunk)


def check(job: FetchJob, manifest: hc.Manifest) -> list[str]:
    """Hash every file not checked since it last changed; the names of the bad ones."""
    snap = hc.snapshot_dir(job.cache, job.ref, manifest.commit)
    todo = {n: r for n, r in manifest.files.items()
            if manifest.checked.get(n) is None or manifest.checked[n] != hc.stamp(snap / n)}
    total = sum(r.size for r in todo.values() if r.hashed)
    done = 0
    last = 0.0

    def on_bytes(n: int) -> None:
        nonlocal done, last
        done += n
        if time.monotonic() - last >= TICK:
            last = time.monotonic()
            job.link.send(m.DownloadProgress(done=min(done, total), total=total, verifying=True))

    bad = []
    for name, rec in sorted(todo.items()):
        before = hc.stamp(snap / name)
        if before is not None and (not rec.hashed or digest(snap / name, rec, on_bytes)):
            manifest.checked[name] = before
        else:
            bad.append(name)
            manifest.checked.pop(name, None)
    return bad


def drop(job: FetchJob, manifest: hc.Manifest, names: list[str]) -> None:
    """Remove bad files (their blob and the snapshot's link) so they are fetched again."""
    snap = hc.snapshot_dir(job.cache, job.ref, manifest.commit)
    for name in names:
        blob = hc.repo_dir(job.cache, job.ref) / "blobs" / manifest.files[name].blob
        for path in (snap / name, blob):
            try:
                path.unlink()
            except FileNotFoundError:
                pass


# Asked before the hub (exod.hub.from_peers): the snapshot, or None to ask the hub.
First = Callable[[FetchJob], Path | None]


def run(job: FetchJob, first: First | None = None) -> Path:
    got = first(job) if first is not None and job.peers else None
    if got is not None:
        return got
    manifest = plan(job)
    for attempt in range(2):
        download(job, manifest)
        bad = check(job, manifest)
        hc.write_manifest(job.cache, job.ref, manifest)
        if not bad:
            break
        what = ", ".join(bad)
        if attempt or job.offline:
            raise FetchRefused(f"{job.ref}: {what} does not match the hub's hash "
                          f"({'offline: cannot fetch it again' if job.offline else 'twice'})")
        job.status(f"{what} does not match the hub's hash: fetching it again")
        print(f"{what} does not match the hub's hash: fetching it again", flush=True)
        drop(job, manifest, bad)
    hc.write_ref(job.cache, job.ref, manifest.commit)
    return hc.snapshot_dir(job.cache, job.ref, manifest.commit)


def refusal(e: Exception) -> str | None:
    """Why retrying `e` will not help, or None (a network error: retried with backoff)."""
    if isinstance(e, FetchRefused):
        return str(e)
    from huggingface_hub import errors

    if isinstance(e, (errors.RepositoryNotFoundError, errors.GatedRepoError)):
        return "repository not found, or no access to it (a gated or private one needs " \
               "hub.hf_token_file)"
    if isinstance(e, errors.RevisionNotFoundError):
        return "revision not found"
    if isinstance(e, errors.EntryNotFoundError):
        return f"file not found: {e}"
    status = getattr(getattr(e, "response", None), "status_code", None)
    if status in (401, 403):
        return f"no access (HTTP {status}; a gated or private repository needs " \
               "hub.hf_token_file)"
    return None


def plan_only(job: FetchJob) -> int:
    """A `PlanAsk`: one `Planned` (commit, size, missing bytes, free bytes), or the refusal."""
    try:
        manifest = plan(job)
    except Exception as e:  # noqa: BLE001 -- reported as one line, as main does
        job.link.send(m.Failed(reason=refusal(e) or unreachable(job, e, where=False) or
                               f"{type(e).__name__}: {e}", exit_code=EXIT_UNAVAILABLE))
        return EXIT_UNAVAILABLE
    missing = manifest.size - hc.partial_bytes(
        job.cache, job.ref, {r.blob: r.size for r in manifest.files.values()})
    job.link.send(Planned(commit=manifest.commit, size=manifest.size, missing=missing,
                          free=free_space(job.cache)))
    return 0


def main(job: FetchJob, peers: First | None = None) -> int:
    try:
        path = run(job, peers)
    except Exception as e:  # noqa: BLE001 -- every failure is reported, as one line
        why = refusal(e) or unreachable(job, e)
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        reason = f"{job.ref}: {why}" if why and not isinstance(e, FetchRefused) else why or \
            f"{job.ref}: {type(e).__name__}: {first}"
        job.link.send(m.Failed(reason=reason, exit_code=EXIT_UNAVAILABLE if why else
                               EXIT_TEMPFAIL))
        print(reason, flush=True)
        return EXIT_UNAVAILABLE if why else EXIT_TEMPFAIL
    job.link.send(m.Fetched(path=str(path), commit=path.name))
    return 0
