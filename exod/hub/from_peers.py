"""A hub model's files from cluster peers, before the hub (docs/cluster.md "Model files from
peers"): run in the fetcher process, with the peers the daemon chose (exod.core.file_peers).

The snapshot's manifest (the hub's hashes, as the peer recorded them when it fetched from the
hub) comes from this node's own record when it has one, else from the first peer that answers,
signed with the cluster's key. Each missing file then comes from the first peer that serves it
whole: into the cache's `blobs/HASH.incomplete` as the hub fetcher writes it, resumed from its
end after a stop, hashed as it arrives. A file whose hash is wrong is dropped and asked of the
next peer. A peer that cannot be reached, refuses, or breaks off is passed over. When no peer
could give every file, `run` says None and the hub is asked, as if no peer had it.
"""

from __future__ import annotations

import json
import os
import queue
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any

from exod.core.file_peers import PeerSource
from exod.hub import cache as hc
from exod.hub.fetch import CHUNK, BytesReporter, FetchJob, check, drop, fetch_file, free_space
from exod.hub.files import disk_problem, servable
from exod.hub.verify import Hasher
from exod.wire.announce import MAX_LINE, cluster_id, new_nonce
from exod.wire.peer_files import FileAsk, open_manifest, sign_ask

CONNECT_TIMEOUT = 10.0
ANSWER_TIMEOUT = 30.0  # for the answer's line only: the bytes after it take what they take
BLOB_RE = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


class PeerFailed(Exception):
    """This peer cannot serve this (no answer, a refusal, a broken connection)."""


def ask(job: FetchJob, src: PeerSource, revision: str, path: str = "",
        offset: int = 0) -> tuple[socket.socket, Any, dict[str, Any], str]:
    """Send one signed ask; the connection, its reader, the answer's line, the ask's nonce."""
    nonce = new_nonce()
    body = FileAsk(cluster_id(job.cluster_key), os.uname().nodename, time.time(), nonce,
                   job.ref.repo, revision, path, offset)
    try:
        sock = socket.create_connection((src.host, src.port), timeout=CONNECT_TIMEOUT)
    except OSError as e:
        raise PeerFailed(f"{src.name} ({src.host}:{src.port}) cannot be reached: "
                         f"{e.strerror or type(e).__name__}") from None
    try:
        sock.sendall(json.dumps({"file": sign_ask(body, job.cluster_key)}).encode() + b"\n")
        sock.settimeout(ANSWER_TIMEOUT)
        reader = sock.makefile("rb")
        line = reader.readline(MAX_LINE + 1)
        answer = json.loads(line)
        if not isinstance(answer, dict):
            raise ValueError("not an object")
    except (OSError, ValueError) as e:
        sock.close()
        raise PeerFailed(f"{src.name} gave no answer: {e}") from None
    if "refused" in answer:
        sock.close()
        raise PeerFailed(f"{src.name} refused: {str(answer['refused'])[:300]}")
    return sock, reader, answer, nonce


def manifest_of(job: FetchJob, src: PeerSource) -> hc.Manifest:
    """`src`'s record of the snapshot, checked: signed for this ask, every file hashed, every
    name one a runner needs at the top of the snapshot, every blob named by its hash."""
    sock, _, answer, nonce = ask(job, src, job.commit or job.ref.revision)
    sock.close()
    try:
        manifest = hc.Manifest.from_json(open_manifest(answer, nonce, job.cluster_key))
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise PeerFailed(f"{src.name} sent no usable manifest: {e}") from None
    for name, rec in manifest.files.items():
        if not servable(name) or not BLOB_RE.fullmatch(rec.blob) or \
                rec.blob != (rec.sha256 or rec.git_sha1):
            raise PeerFailed(f"{src.name}'s manifest names {name[:100]!r} strangely")
    if job.ref.pinned and manifest.commit != job.ref.revision or not manifest.files:
        raise PeerFailed(f"{src.name}'s manifest is of another commit")
    return manifest


class Beside:
    """Hashes the chunks it is given on a thread of its own, while the next ones arrive: a LAN
    can bring bytes as fast as one core hashes them (hashlib lets go of the GIL meanwhile)."""

    def __init__(self, hasher: Hasher) -> None:
        self.hasher = hasher
        self.queue: queue.Queue[bytes | None] = queue.Queue(maxsize=8)
        self.thread = threading.Thread(target=self._run, name="exod-peer-hash", daemon=True)

    def _run(self) -> None:
        while (chunk := self.queue.get()) is not None:
            self.hasher.update(chunk)

    def put(self, chunk: bytes) -> None:
        self.queue.put(chunk)

    def __enter__(self) -> Beside:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.queue.put(None)  # what came is hashed before the caller reads the hash
        self.thread.join()


def getter(src: PeerSource) -> Any:
    """What appends a file's rest from `src` (exod.hub.fetch's `Getter`)."""

    def get(job: FetchJob, commit: str, name: str, part: Path, have: int,
            hasher: Hasher) -> None:
        sock, reader, answer, _ = ask(job, src, commit, name, have)
        try:
            head = answer.get("file")
            if not isinstance(head, dict) or head.get("offset") != have or \
                    head.get("size") != hasher.rec.size:
                raise PeerFailed(f"{src.name} answered {str(answer)[:200]}")
            sock.settimeout(None)  # no timeout: the daemon's stall watch judges a silent peer
            left = hasher.rec.size - have
            with open(part, "ab") as f, Beside(hasher) as hashing:
                while left > 0:
                    chunk = reader.read1(min(CHUNK * 16, left))
                    if not chunk:
                        raise PeerFailed(f"{src.name} broke off with {left} byte(s) to come")
                    f.write(chunk)
                    hashing.put(chunk)
                    left -= len(chunk)
        except OSError as e:
            raise PeerFailed(f"{src.name} broke off: {e.strerror or e}") from None
        finally:
            sock.close()

    return get


def first_manifest(job: FetchJob) -> tuple[hc.Manifest, tuple[PeerSource, ...]] | None:
    """The manifest (this node's record, else a peer's) and the peers to ask, or None."""
    if job.commit is not None:
        known = hc.read_manifest(job.cache, job.ref, job.commit)
        if known is not None and all(r.hashed for r in known.files.values()):
            return known, job.peers
    for i, src in enumerate(job.peers):
        try:
            return manifest_of(job, src), job.peers[i:]
        except PeerFailed as e:
            say(job, str(e))
    return None


def say(job: FetchJob, text: str) -> None:
    print(text, flush=True)  # the fetcher's output goes to the daemon's log
    job.status(text)


def fetch_files(job: FetchJob, manifest: hc.Manifest, peers: tuple[PeerSource, ...],
                names: set[str]) -> bool:
    """`names` of the snapshot from `peers`, each from the first that serves it whole and
    right; whether every one came."""
    snap = hc.snapshot_dir(job.cache, job.ref, manifest.commit)
    missing = sorted((n for n in names if not (snap / n).exists()),
                     key=lambda n: manifest.files[n].size)
    if not missing:
        return True
    need = manifest.size - hc.partial_bytes(job.cache, job.ref,
                                            {r.blob: r.size for r in manifest.files.values()})
    problem = disk_problem(str(job.ref), need, free_space(job.cache), str(job.cache))
    if problem:
        say(job, problem)
        return False
    with BytesReporter(job, manifest) as reporter:
        for name in missing:
            for src in peers:
                reporter.source = src.name
                try:
                    good = fetch_file(job, manifest.commit, name, manifest.files[name],
                                      getter(src))
                except PeerFailed as e:
                    say(job, f"{name}: {e}; trying another peer")
                    continue
                if good is False:
                    say(job, f"{name} from {src.name} does not match the hub's hash: trying "
                        "another peer")
                    drop(job, manifest, [name])
                    continue
                stamp = hc.stamp(snap / name)
                if stamp is not None:
                    manifest.checked[name] = stamp
                break
            else:
                return False
    return True


def run(job: FetchJob, names: set[str] | None = None) -> Path | None:
    """The snapshot with `names` (None: every file) fetched from peers and checked against the
    hub's hashes; None when the peers could not give them all (the hub is asked next)."""
    strange = hc.repo_problem(job.cache, job.ref, job.commit)
    if strange is not None or not job.cluster_key:
        return None
    got = first_manifest(job)
    if got is None:
        return None
    manifest, peers = got
    wanted = set(manifest.files) if names is None else names & set(manifest.files)
    say(job, f"fetching {job.ref} from cluster peers: {', '.join(s.name for s in peers)}")
    for _ in range(2):
        if not fetch_files(job, manifest, peers, wanted):
            hc.write_manifest(job.cache, job.ref, manifest)  # what came stays checked
            return None
        bad = [n for n in check(job, manifest) if n in wanted]
        hc.write_manifest(job.cache, job.ref, manifest)
        if not bad:
            hc.write_ref(job.cache, job.ref, manifest.commit)
            return hc.snapshot_dir(job.cache, job.ref, manifest.commit)
        say(job, f"{', '.join(bad)} does not match the hub's hash: fetching it again")
        drop(job, manifest, bad)
    return None
