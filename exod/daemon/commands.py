"""What exoctl can ask of the daemon over the control socket: status, start, stop, restart,
reload, cache clear, and the streams: `wait` (one instance's progress until it settles),
`watch` (a snapshot at every change, for tests and dashboards) and `logs` (a runner's recent
output, then with `follow` its new lines until the client goes away)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar

from exod.wire import control as cm
from exod.wire import control_status as cs
from exod.core.states import State
from exod.daemon import cache_commands, hub_commands
from exod.daemon.control import CommandError, Emit
from exod.daemon.instance import InstanceRuntime
from exod.daemon.log_ring import Line, LogRings
from exod.daemon.reload import Reloader
from exod.daemon.usage.keeper import UsageKeeper

MAX_TAIL = 100_000  # more than any ring holds: asking for more is asking for everything


class CommandTarget(Protocol):
    """What the operator commands need of the daemon."""

    @property
    def stopping(self) -> bool: ...

    @property
    def phase(self) -> str:
        """starting (until the always-on instances are started), running, stopping"""
        ...

    def snapshot(self) -> cs.Snapshot: ...

    @property
    def reloader(self) -> Reloader: ...

    def instance(self, name: str) -> InstanceRuntime | None: ...

    def instance_status(self, inst: InstanceRuntime) -> cs.InstanceStatus: ...

    def listen(self, fn: Callable[[InstanceRuntime], None]) -> Callable[[], None]: ...

    @property
    def logs(self) -> LogRings: ...

    def ordered(self) -> list[InstanceRuntime]: ...

    @property
    def usage(self) -> UsageKeeper: ...

    def cache_folder(self, inst: InstanceRuntime) -> Path | None:
        """The instance's folder of the prompt cache's disk tier on this host; None while
        another exod holds the folder it is in."""
        ...


MAX_QUEUED = 256  # changes waiting for one `wait`/`watch` client; beyond, it is dropped


T = TypeVar("T")


def _offer(q: asyncio.Queue[T], overflow: list[bool], make: Callable[[], T]) -> None:
    """Queue a change for a streaming client, or mark it overflowing (it is then ended)."""
    if overflow:
        return
    if q.full():
        overflow.append(True)
        return
    q.put_nowait(make())


class Commands:
    def __init__(self, daemon: CommandTarget) -> None:
        self.sup = daemon

    def _get(self, name: str) -> InstanceRuntime:
        inst = self.sup.instance(name)
        if inst is None:
            raise CommandError(f"no instance named {name!r}")
        return inst

    async def command(self, req: cm.Request, emit: Emit) -> cm.Reply:
        sup = self.sup
        if isinstance(req, cm.GetStatus):
            snap = sup.snapshot()
            return cm.StatusReply(snap.daemon, snap.instances, snap.cluster)
        if isinstance(req, cm.Reload):
            return await sup.reloader.reload()
        if sup.stopping and isinstance(req, (cm.Start, cm.RestartRequest)):
            return cm.Failure("exod is stopping")
        if isinstance(req, cm.Start):
            inst = self._get(req.name)
            inst.start(operator=True)
            if inst.refused:  # memory admission said no: that is the answer to the start
                return cm.Failure(f"{inst.name} not started: {inst.refused}")
            return cm.StateReply(inst.state)
        if isinstance(req, cm.Stop):
            inst = self._get(req.name)
            await self._stopped(inst, operator=True)
            return cm.StateReply(inst.state)
        if isinstance(req, cm.RestartRequest):
            inst = self._get(req.name)
            await self._stopped(inst, operator=False)
            if sup.stopping:  # shutdown began while this instance was stopping
                return cm.Failure("exod is stopping")
            inst = self._get(inst.name)  # a reload may have replaced it meanwhile
            inst.start(operator=True)
            return cm.StateReply(inst.state)
        if isinstance(req, cm.Wait):
            return await self._wait(self._get(req.name), emit)
        if isinstance(req, cm.Watch):
            return await self._watch(emit)
        if isinstance(req, (cm.Pull, cm.Models, cm.RemoveModel)):
            return await hub_commands.run(sup, req, emit)  # type: ignore[arg-type]
        if isinstance(req, cm.ClearCacheRequest):
            chosen = [self._get(req.name)] if req.name is not None else sup.ordered()
            return cache_commands.clear(chosen, sup.cache_folder)
        if isinstance(req, cm.UsageRequest):
            return await self._usage(req)
        return await self._logs(req, emit)

    async def _usage(self, req: cm.UsageRequest) -> cm.UsageReply:
        usage = self.sup.usage
        sums = await usage.summary(req.key, req.since)
        return cm.UsageReply(str(usage.folder), [cm.UsageSums(
            s.key, s.instance, s.requests, s.failed, s.prompt_tokens, s.cached_tokens,
            s.completion_tokens, round(s.batch_seconds, 6)) for s in sums])

    async def _stopped(self, inst: InstanceRuntime, operator: bool) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def done() -> None:
            if not fut.done():
                fut.set_result(None)

        inst.stop(then=done, operator=operator)
        await fut

    async def _wait(self, inst: InstanceRuntime, emit: Emit) -> cm.WaitReply | cm.Failure:
        """Stream progress until the instance is ready (ok) or settles otherwise (not ok)."""
        name = inst.name
        q: asyncio.Queue[cs.InstanceStatus] = asyncio.Queue(MAX_QUEUED)
        overflow: list[bool] = []

        def on_change(changed: InstanceRuntime) -> None:
            # A copy now: by the time the stream sends it, later changes would have merged.
            if changed.name == name:
                _offer(q, overflow, lambda: self.sup.instance_status(changed))

        unlisten = self.sup.listen(on_change)
        try:
            snap = self.sup.instance_status(inst)
            while True:
                if overflow:
                    return cm.Failure("dropped: the client read too slowly")
                if snap.state is State.READY:
                    return cm.WaitReply(snap)
                if snap.state in (State.FAILED, State.STOPPED) and not self._to_start(inst):
                    return cm.Failure(f"{name} is {snap.detail}", instance=snap)
                await emit(cm.ProgressEvent(snap))
                snap = await q.get()
        finally:
            unlisten()

    def _to_start(self, inst: InstanceRuntime) -> bool:
        """Stopped only until the daemon's start-up starts it (after the zygote's imports:
        exod.daemon.zygote)."""
        return self.sup.phase == "starting" and not self.sup.stopping and \
            inst.config.always_on and inst.state is State.STOPPED

    async def _watch(self, emit: Emit) -> cm.Failure:
        """Stream a full snapshot at every change, until the client goes away."""
        q: asyncio.Queue[cs.Snapshot] = asyncio.Queue(MAX_QUEUED)
        overflow: list[bool] = []
        unlisten = self.sup.listen(lambda _inst: _offer(q, overflow, self.sup.snapshot))
        try:
            snap = self.sup.snapshot()
            while True:
                await emit(cm.SnapshotEvent(snap.daemon, snap.instances, snap.cluster))
                snap = await q.get()
                if overflow:
                    return cm.Failure("dropped: the client read too slowly")
        finally:
            unlisten()

    async def _logs(self, req: cm.Logs, emit: Emit) -> cm.DoneReply:
        """The last lines as line events, then (follow) every new one until the client
        leaves."""
        name = self._get(req.name).name
        n, rank = req.lines, req.rank
        q: asyncio.Queue[Line] = asyncio.Queue(maxsize=10_000)

        def on_line(line: Line) -> None:
            if line.instance == name and (rank is None or line.rank == rank) and not q.full():
                q.put_nowait(line)

        unfollow = self.sup.logs.follow(on_line) if req.follow else None
        try:
            for line in self.sup.logs.tail(name, min(n, MAX_TAIL), rank):
                await emit(line.event())
            while unfollow is not None:
                await emit((await q.get()).event())
            return cm.DoneReply()
        finally:
            if unfollow is not None:
                unfollow()
