"""What exoctl can ask of the daemon over the control socket: status, start, stop, restart,
reload, and the streams: `wait` (one instance's progress until it settles), `watch` (a snapshot
at every change, for tests and dashboards) and `logs` (a runner's recent output, then with
`follow` its new lines until the client goes away)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from exod.core.states import State
from exod.daemon.control import CommandError, Emit
from exod.daemon.instance import InstanceRuntime
from exod.daemon.log_ring import Line, LogRings

MAX_TAIL = 100_000  # more than any ring holds: asking for more is asking for everything


class Daemon(Protocol):
    """What the operator commands need of the daemon."""

    @property
    def stopping(self) -> bool: ...

    def snapshot(self) -> dict[str, Any]: ...

    async def reload(self) -> dict[str, Any]: ...

    def instance(self, name: str) -> InstanceRuntime | None: ...

    def instance_json(self, inst: InstanceRuntime) -> dict[str, Any]: ...

    def listen(self, fn: Callable[[InstanceRuntime], None]) -> Callable[[], None]: ...

    @property
    def logs(self) -> LogRings: ...


MAX_QUEUED = 256  # changes waiting for one `wait`/`watch` client; beyond, it is dropped


def _offer(q: asyncio.Queue[dict[str, Any]], overflow: list[bool],
           make: Callable[[], dict[str, Any]]) -> None:
    """Queue a change for a streaming client, or mark it overflowing (it is then ended)."""
    if overflow:
        return
    if q.full():
        overflow.append(True)
        return
    q.put_nowait(make())


class Commands:
    def __init__(self, daemon: Daemon) -> None:
        self.sup = daemon

    def _get(self, name: Any) -> InstanceRuntime:
        inst = self.sup.instance(name) if isinstance(name, str) else None
        if inst is None:
            raise CommandError(f"no instance named {name!r}")
        return inst

    async def command(self, cmd: str, req: dict[str, Any], emit: Emit) -> dict[str, Any]:
        sup = self.sup
        if cmd == "status":
            return {"ok": True, **sup.snapshot()}
        if cmd == "reload":
            return await sup.reload()
        if sup.stopping and cmd in ("start", "restart"):
            return {"ok": False, "error": "exod is stopping"}
        if cmd == "start":
            inst = self._get(req.get("name"))
            inst.start(operator=True)
            if inst.refused:  # memory admission said no: that is the answer to the start
                return {"ok": False, "error": f"{inst.name} not started: {inst.refused}"}
            return {"ok": True, "state": inst.state.value}
        if cmd == "stop":
            inst = self._get(req.get("name"))
            await self._stopped(inst, operator=True)
            return {"ok": True, "state": inst.state.value}
        if cmd == "restart":
            inst = self._get(req.get("name"))
            await self._stopped(inst, operator=False)
            if sup.stopping:  # shutdown began while this instance was stopping
                return {"ok": False, "error": "exod is stopping"}
            inst = self._get(inst.name)  # a reload may have replaced it meanwhile
            inst.start(operator=True)
            return {"ok": True, "state": inst.state.value}
        if cmd == "wait":
            return await self._wait(self._get(req.get("name")), emit)
        if cmd == "watch":
            return await self._watch(emit)
        if cmd == "logs":
            return await self._logs(req, emit)
        raise CommandError(f"unknown command {cmd!r}")

    async def _stopped(self, inst: InstanceRuntime, operator: bool) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def done() -> None:
            if not fut.done():
                fut.set_result(None)

        inst.stop(then=done, operator=operator)
        await fut

    async def _wait(self, inst: InstanceRuntime, emit: Emit) -> dict[str, Any]:
        """Stream progress until the instance is ready (ok) or settles otherwise (not ok)."""
        name = inst.name
        q: asyncio.Queue[dict[str, Any]] = asyncio.Queue(MAX_QUEUED)
        overflow: list[bool] = []

        def on_change(changed: InstanceRuntime) -> None:
            # A copy now: by the time the stream sends it, later changes would have merged.
            if changed.name == name:
                _offer(q, overflow, lambda: self.sup.instance_json(changed))

        unlisten = self.sup.listen(on_change)
        try:
            snap = self.sup.instance_json(inst)
            while True:
                if overflow:
                    return {"ok": False, "error": "dropped: the client read too slowly"}
                if snap["state"] == State.READY.value:
                    return {"ok": True, "instance": snap}
                if snap["state"] in (State.FAILED.value, State.STOPPED.value):
                    return {"ok": False, "error": f"{name} is {snap['detail']}", "instance": snap}
                await emit({"event": "progress", "instance": snap})
                snap = await q.get()
        finally:
            unlisten()

    async def _watch(self, emit: Emit) -> dict[str, Any]:
        """Stream a full snapshot at every change, until the client goes away."""
        q: asyncio.Queue[dict[str, Any]] = asyncio.Queue(MAX_QUEUED)
        overflow: list[bool] = []
        unlisten = self.sup.listen(lambda _inst: _offer(q, overflow, self.sup.snapshot))
        try:
            await emit({"event": "snapshot", **self.sup.snapshot()})
            while True:
                snap = await q.get()
                if overflow:
                    return {"ok": False, "error": "dropped: the client read too slowly"}
                await emit({"event": "snapshot", **snap})
        finally:
            unlisten()

    async def _logs(self, req: dict[str, Any], emit: Emit) -> dict[str, Any]:
        """`{"cmd": "logs", "name": N, "lines": 20, "rank": R|null, "follow": bool}`: the last
        lines as `{"event": "line", ...}`, then (follow) every new one until the client leaves."""
        name = self._get(req.get("name")).name
        n, rank, follow = req.get("lines", 20), req.get("rank"), bool(req.get("follow"))
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise CommandError(f"lines must be a whole number >= 0, got {n!r}")
        if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool)):
            raise CommandError(f"rank must be a whole number, got {rank!r}")
        q: asyncio.Queue[Line] = asyncio.Queue(maxsize=10_000)

        def on_line(line: Line) -> None:
            if line.instance == name and (rank is None or line.rank == rank) and not q.full():
                q.put_nowait(line)

        unfollow = self.sup.logs.follow(on_line) if follow else None
        try:
            for line in self.sup.logs.tail(name, min(n, MAX_TAIL), rank):
                await emit({"event": "line", **line.to_json()})
            while unfollow is not None:
                await emit({"event": "line", **(await q.get()).to_json()})
            return {"ok": True}
        finally:
            if unfollow is not None:
                unfollow()
