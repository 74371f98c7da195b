"""The serving side of model files between peers (docs/cluster.md "Model files from peers").

A file ask (exod.wire.peer_files) on the cluster endpoint is served only when it proves the
cluster's key, is fresh (its time within `max_clock_skew`, its nonce not seen), names a hub
model by a valid name whose snapshot this node holds complete with exod's record of the hub's
hashes, and, for a file, names one that record lists. The file is opened where the snapshot's
link leads only when that is inside the repository's own blobs (or the snapshot itself, for
a plain file), and never through a link at the last step; nothing else of the disk can be
named. The bytes go by sendfile, with no timeout: a slow link takes as long as it takes.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loguru import logger

from exod.core.hub_ref import HubRef, make
from exod.core.replay import ReplayGuard
from exod.hub import cache as hc
from exod.hub.files import servable
from exod.wire.announce import Refused
from exod.wire.peer_files import FileAsk, open_ask, sign_manifest

# (address, kind, reason, claimed node id): one row and one log line, as discovery's refusals.
Refuse = Callable[[str, str, str, str], None]


@dataclass(frozen=True)
class ServedFile:
    fd: int
    size: int


def open_file(cache: Path, ref: HubRef, commit: str, rec: hc.FileRecord, name: str) -> ServedFile:
    """`name` of the snapshot, opened for reading; Refused when it leads anywhere but the
    repository's blobs (or is a plain file of the snapshot), or is not what the record says."""
    if hc.repo_problem(cache, ref, commit) is not None:
        raise Refused("bad-path", f"{ref.repo}'s folder in the cache is not a plain folder")
    repo = hc.repo_dir(cache, ref).resolve()
    snap = hc.snapshot_dir(cache, ref, commit)
    where = (snap / name).resolve()
    if where.parent != repo / "blobs" and where.parent != snap.resolve():
        raise Refused("bad-path", f"{name} leads out of {ref.repo}'s folder in the cache")
    try:
        fd = os.open(where, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise Refused("missing", f"{name} of {ref.repo} cannot be read: {e.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size != rec.size:
        os.close(fd)
        raise Refused("missing", f"{name} of {ref.repo} is not whole on this node")
    return ServedFile(fd, st.st_size)


def find(cache: Path, ask: FileAsk) -> tuple[HubRef, hc.Manifest]:
    """The model `ask` names and this node's record of its snapshot; Refused otherwise."""
    try:
        ref = make(ask.repo, ask.revision)
    except ValueError as e:
        raise Refused("bad-path", f"not a hub model: {e}") from None
    found = hc.cached(cache, ref)
    manifest = hc.read_manifest(cache, ref, found.commit) if found is not None else None
    if found is None or manifest is None or not all(r.hashed for r in manifest.files.values()):
        raise Refused("missing", f"{ref} is not whole, with the hub's hashes, on this node")
    if ask.path and (not servable(ask.path) or ask.path not in manifest.files):
        raise Refused("bad-path", f"{ask.path[:200]!r} is not a file of {ref}'s snapshot")
    return ref, manifest


class FileServer:
    def __init__(self, key: bytes, cache: Path, skew: float, refuse: Refuse,
                 wall: Callable[[], float] = time.time) -> None:
        self.key, self.cache, self.refuse, self.wall = key, cache, refuse, wall
        self.replay = ReplayGuard(skew)
        self.served = 0  # bytes sent, all asks together

    async def serve(self, signed: Any, address: str, writer: asyncio.StreamWriter) -> None:
        """Answer one file ask (the first line of a connection) on `writer`."""
        ask: FileAsk | None = None
        try:
            ask = open_ask(signed, self.key)
            stale = self.replay.check(ask.time, ask.nonce, self.wall())
            if stale is not None:
                raise Refused(stale[0], stale[1])
            ref, manifest = await asyncio.to_thread(find, self.cache, ask)
            if not ask.path:
                answer = sign_manifest(manifest.to_json() | {"checked": {}}, ask.nonce, self.key)
                writer.write(_line(answer))
                await writer.drain()
                return
            rec = manifest.files[ask.path]
            opened = await asyncio.to_thread(open_file, self.cache, ref, manifest.commit, rec,
                                             ask.path)
        except Refused as e:
            self.refuse(address, e.kind, e.reason, ask.node if ask is not None else e.claimed)
            writer.write(_line({"refused": e.reason}))
            await writer.drain()
            return
        await self._send(ask, opened, address, writer)

    async def _send(self, ask: FileAsk, opened: ServedFile, address: str,
                    writer: asyncio.StreamWriter) -> None:
        offset = min(ask.offset, opened.size)
        sent = 0
        try:
            with os.fdopen(opened.fd, "rb") as f:
                writer.write(_line({"file": {"size": opened.size, "offset": offset}}))
                await writer.drain()
                if offset < opened.size:
                    loop = asyncio.get_running_loop()
                    sent = await loop.sendfile(writer.transport, f, offset,
                                               opened.size - offset)
        finally:
            self.served += sent
            logger.bind(event="peer-files").info(
                "cluster: sent {} of {}@{} from offset {}: {} byte(s) to {} ({})", ask.path,
                ask.repo, ask.revision, offset, sent, ask.node, address)


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj).encode() + b"\n"
