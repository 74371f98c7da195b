"""The control socket's commands for models named by hub repository: `pull` (fetch ahead of
time, streaming progress until it is done), `models` (what the cache holds and which instances
use it) and `remove_model` (delete a repository no running instance uses: whatever stands at
its name, a link as a link, never followed; the answer and the log say what was removed)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any, Protocol

from loguru import logger

from exod.wire import control as cm
from exod.cache_files import Removal
from exod.core.states import State
from exod.daemon.control import CommandError, Emit
from exod.daemon.downloads import Download, Outcome
from exod.daemon.hub_models import HubModels
from exod.daemon.instance import InstanceRuntime
from exod.hub import cache as hub_cache
from exod.core import hub_ref
from exod.core.hub_ref import HubRef


class HubCommandTarget(Protocol):
    """What the hub models' commands need of the daemon (exoctl's and the Ollama API's)."""

    @property
    def hub(self) -> HubModels: ...

    @property
    def instances(self) -> dict[str, InstanceRuntime]: ...

    def now(self) -> float: ...


def _ref(name: str) -> HubRef:
    try:
        return hub_ref.parse(name)
    except ValueError as e:
        raise CommandError(str(e)) from None


async def run(sup: HubCommandTarget, req: cm.Pull | cm.Models | cm.RemoveModel,
              emit: Emit) -> cm.Reply:
    if isinstance(req, cm.Pull):
        return await pull(sup, _ref(req.name), emit)
    if isinstance(req, cm.Models):
        return cm.ModelsReply(str(sup.hub.folder), models(sup))
    return await remove(sup, _ref(req.name))


async def follow(sup: HubCommandTarget, ref: HubRef) -> AsyncIterator[cm.DownloadEvent | Outcome]:
    """Fetch `ref` (sharing a download in progress): its progress at every change, then its
    outcome. A client that stops following (its task cancelled) leaves the download, which
    goes on only for whoever else waits for it; its partial files stay for the next pull."""
    done: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
    q: asyncio.Queue[cm.DownloadEvent] = asyncio.Queue(256)
    owner = object()

    def finished(outcome: Outcome) -> None:
        if not done.done():
            done.set_result(outcome)

    d = sup.hub.pull(ref, owner, finished)

    def changed(changed: Download) -> None:
        if changed is d and not q.full():
            q.put_nowait(d.event(sup.now()))

    unlisten = sup.hub.listen_downloads(changed)
    try:
        if not done.done():
            yield d.event(sup.now())
        while not done.done():
            getter = asyncio.ensure_future(q.get())
            both: list[asyncio.Future[Any]] = [getter, done]
            try:
                await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
            finally:
                getter.cancel()
            if getter.done() and not getter.cancelled():
                yield getter.result()
    finally:
        unlisten()
        if not done.done():  # the client went away: the download need not go on for it
            sup.hub.downloads.leave(owner, lambda: None)
    yield done.result()


async def pull(sup: HubCommandTarget, ref: HubRef, emit: Emit) -> cm.PullReply | cm.Failure:
    """`exoctl pull`: a progress event at every change, then where the snapshot is."""
    async for step in follow(sup, ref):
        if isinstance(step, cm.DownloadEvent):
            await emit(step)
            continue
        if step.path is None:
            return cm.Failure(step.error)
        return cm.PullReply(str(step.path), step.path.name)
    raise AssertionError("unreachable: follow ends with the outcome")


def users(sup: HubCommandTarget, repo: str) -> list[tuple[InstanceRuntime, HubRef]]:
    """The instances whose model or draft model is `repo`, with the revision each names."""
    return [(i, ref) for i in sup.instances.values()
            for ref in (i.config.hub, i.config.draft_hub) if ref is not None and ref.repo == repo]


def models(sup: HubCommandTarget) -> list[cm.CachedModel]:
    """The cache's repositories; the last use of each is the later of its last fetch or start
    (its record's time, on disk) and the last use of one of its instances (its idle clock:
    exod.daemon.idle)."""
    wall = time.time() - sup.now()  # the seam's monotonic clock to the epoch
    out = []
    for e in hub_cache.entries(sup.hub.folder):
        using = users(sup, e.repo)
        served = [i.idle.last_used + wall for i, _ in using if i.idle.last_used is not None]
        last = max([*served, *([e.last_use] if e.last_use is not None else [])], default=None)
        out.append(cm.CachedModel(e.repo, e.revisions, list(e.commits), e.size, e.partial,
                                  [cm.ModelUser(i.name, i.state, ref.revision)
                                   for i, ref in using], last, e.problem))
    return out


class InUse(Exception):
    """Why a repository cannot be removed now."""


async def remove(sup: HubCommandTarget, ref: HubRef) -> cm.RemovedReply | cm.Failure:
    try:
        removed = await remove_repo(sup, ref)
    except InUse as e:
        return cm.Failure(str(e))
    if not removed.found:
        return cm.Failure(f"{ref.repo} is not in the cache at {sup.hub.folder}")
    if not removed.whole:
        return cm.Failure(f"cannot remove all of {ref.repo}: {removed.text()}")
    return cm.RemovedReply(ref.repo, removed.text())


async def remove_repo(sup: HubCommandTarget, ref: HubRef) -> Removal:
    """Delete `ref`'s repository from the cache, whatever stands at its name (a link as a link,
    never followed), and log what was done; raises InUse, naming the instances that run from
    it, or the download under way."""
    busy = sorted(i.name for i, _ in users(sup, ref.repo)
                  if i.state not in (State.STOPPED, State.FAILED))
    if busy:
        raise InUse(f"{ref.repo} is used by instance{'s' if len(busy) > 1 else ''} "
                    f"{', '.join(busy)}: stop {'them' if len(busy) > 1 else 'it'} first")
    if any(d.ref.repo == ref.repo for d in sup.hub.downloads.by_key.values()):
        raise InUse(f"{ref.repo} is being downloaded")
    removed = await asyncio.to_thread(hub_cache.remove, sup.hub.folder, ref)
    if removed.found:
        log = logger.info if removed.whole else logger.warning
        log("hub cache: {}: {}", ref.repo, removed.text())
    return removed
