"""The control socket's commands for models named by hub repository: `pull` (fetch ahead of
time, streaming progress until it is done), `models` (what the cache holds and which instances
use it) and `remove_model` (delete a repository no running instance uses)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Protocol

from exod import control_messages as cm
from exod.core.states import State
from exod.daemon.control import CommandError, Emit
from exod.daemon.downloads import Download, Downloads, Outcome
from exod.daemon.instance import InstanceRuntime
from exod.hub import cache as hub_cache
from exod.hub import ref as hub_ref
from exod.hub.ref import HubRef



class Daemon(Protocol):
    @property
    def hub_cache(self) -> Path: ...

    @property
    def instances(self) -> dict[str, InstanceRuntime]: ...

    def pull(self, ref: HubRef, owner: object, on_done: Any) -> Download: ...

    def listen_downloads(self, fn: Any) -> Any: ...

    def now(self) -> float: ...

    @property
    def downloads(self) -> Downloads: ...


def _ref(name: str) -> HubRef:
    try:
        return hub_ref.parse(name)
    except ValueError as e:
        raise CommandError(str(e)) from None


async def run(sup: Daemon, req: cm.Pull | cm.Models | cm.RemoveModel, emit: Emit) -> cm.Reply:
    if isinstance(req, cm.Pull):
        return await pull(sup, _ref(req.name), emit)
    if isinstance(req, cm.Models):
        return cm.ModelsReply(str(sup.hub_cache), models(sup))
    return await remove(sup, _ref(req.name))


async def pull(sup: Daemon, ref: HubRef, emit: Emit) -> cm.PullReply | cm.Failure:
    """Fetch `ref` (sharing a download in progress); a progress event at every change."""
    done: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
    q: asyncio.Queue[str] = asyncio.Queue(256)
    owner = object()

    def finished(outcome: Outcome) -> None:
        if not done.done():
            done.set_result(outcome)

    d = sup.pull(ref, owner, finished)

    def changed(changed: Download) -> None:
        if changed is d and not q.full():
            q.put_nowait(d.describe(sup.now()))

    unlisten = sup.listen_downloads(changed)
    try:
        while not done.done():
            getter = asyncio.ensure_future(q.get())
            both: list[asyncio.Future[Any]] = [getter, done]
            await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
            if getter.done():
                await emit(cm.DownloadEvent(getter.result()))
            else:
                getter.cancel()
    finally:
        unlisten()
        if not done.done():  # the client went away: the download need not go on for it
            sup.downloads.leave(owner, lambda: None)
    outcome = done.result()
    if outcome.path is None:
        return cm.Failure(outcome.error)
    return cm.PullReply(str(outcome.path), outcome.path.name)


def users(sup: Daemon, repo: str) -> list[InstanceRuntime]:
    return [i for i in sup.instances.values()
            if i.config.hub is not None and i.config.hub.repo == repo]


def models(sup: Daemon) -> list[cm.CachedModel]:
    return [cm.CachedModel(e.repo, e.revisions, list(e.commits), e.size, e.partial,
                           [cm.ModelUser(i.name, i.state, i.config.hub.revision)
                            for i in users(sup, e.repo) if i.config.hub is not None])
            for e in hub_cache.entries(sup.hub_cache)]


async def remove(sup: Daemon, ref: HubRef) -> cm.RemovedReply | cm.Failure:
    busy = [i.name for i in users(sup, ref.repo)
            if i.state not in (State.STOPPED, State.FAILED)]
    if busy:
        return cm.Failure(f"{ref.repo} is used by {', '.join(busy)}: stop "
                          f"{'them' if len(busy) > 1 else 'it'} first")
    if any(d.ref.repo == ref.repo for d in sup.downloads.by_key.values()):
        return cm.Failure(f"{ref.repo} is being downloaded")
    removed = await asyncio.to_thread(hub_cache.remove, sup.hub_cache, ref)
    if not removed:
        return cm.Failure(f"{ref.repo} is not in the cache at {sup.hub_cache}")
    return cm.RemovedReply(ref.repo)
