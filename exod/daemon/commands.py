"""What exoctl can ask of the daemon over the control socket: status, start, stop, restart,
reload, and the two streams, `wait` (one instance's progress until it settles) and `watch`
(a snapshot at every change, for tests and dashboards)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from exod.core.states import State
from exod.daemon.control import CommandError, Emit
from exod.daemon.instance import InstanceRuntime


class Daemon(Protocol):
    """What the operator commands need of the daemon."""

    @property
    def stopping(self) -> bool: ...

    def snapshot(self) -> dict[str, Any]: ...

    async def reload(self) -> dict[str, Any]: ...

    def instance(self, name: str) -> InstanceRuntime | None: ...

    def instance_json(self, inst: InstanceRuntime) -> dict[str, Any]: ...

    def listen(self, fn: Callable[[InstanceRuntime], None]) -> Callable[[], None]: ...


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
        q: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

        def on_change(changed: InstanceRuntime) -> None:
            # A copy now: by the time the stream sends it, later changes would have merged.
            if changed.name == name:
                q.put_nowait(self.sup.instance_json(changed))

        unlisten = self.sup.listen(on_change)
        try:
            snap = self.sup.instance_json(inst)
            while True:
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
        q: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        unlisten = self.sup.listen(lambda _inst: q.put_nowait(self.sup.snapshot()))
        try:
            await emit({"event": "snapshot", **self.sup.snapshot()})
            while True:
                await emit({"event": "snapshot", **(await q.get())})
        finally:
            unlisten()
