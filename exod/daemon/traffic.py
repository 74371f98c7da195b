"""Requests to instances, the daemon's side: the HTTP layer asks once (`admit`) and gets a lease
(exod.daemon.lease) on the instance that serves the model name, an on-demand one being started.
What is kept of an instance's requests is the instance's own (its lane and
its idle clock: exod.daemon.lane, exod.daemon.idle), dropped with it; nothing is kept here by
name. Refusals are typed (exod.daemon.refusals): the HTTP layer words them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from exod.core.states import State
from exod.daemon.lease import Lease
from exod.daemon.on_demand import Fleet, OnDemand
from exod.daemon.refusals import Mismatch, NotAdmitted, NotServing, ServedElsewhere, Unknown
from exod.facts.embed import Role

if TYPE_CHECKING:
    from exod.daemon.instance import InstanceRuntime


# The HTTP layer's checks of a request against the instance's model, before it may start.
Vet = Callable[["InstanceRuntime"], Awaitable[None]]


class Directory(Fleet, Protocol):
    """The daemon as requests see it: its instances, found by name or alias."""

    def instance(self, name: str) -> InstanceRuntime | None: ...

    def serving(self, name: str) -> InstanceRuntime | None:
        """The instance a request's `model` names (its own name or an alias)."""
        ...


class Traffic:
    def __init__(self, daemon: Directory, touched: Callable[[], None] = lambda: None) -> None:
        self.daemon = daemon
        self.touched = touched  # a request came: memory was taken and will be freed
        self.on_demand = OnDemand(daemon)

    def changed(self, inst: InstanceRuntime) -> None:
        """Requests queued for an instance that can no longer serve them are refused; the
        idle clock of an on-demand instance starts once it is ready."""
        if self.on_demand.gives_up(inst):
            inst.lane.refuse_waiting(lambda: NotServing(inst.name, inst.state.value,
                                                        inst.state is State.STOPPING))
        if inst.state is State.READY and inst.config.on_demand:
            inst.idle.used()

    # ---- one request ----------------------------------------------------------------------
    async def admit(self, name: str, wants: Role | None, keep_alive: float | None = None,
                    vet: Vet | None = None) -> Lease:
        """A lease on the instance that serves `name` (by its name or an alias; an on-demand
        one is started), for a request of the kind `wants` (None: any); raises NotAdmitted,
        whose `instance` names the instance it concerns. `vet`: the HTTP layer's own checks of
        the request against the instance's model (raising its own errors), before anything
        starts. `keep_alive`: the idle window the request asks for once it ends
        (exod.core.keep_alive), None: the instance's own."""
        inst = self.daemon.serving(name)
        try:
            # Told by its model's files, before an on-demand instance is started for nothing.
            serves = None if inst is None or wants is None else await inst.lane.serves()
            if serves is not None and serves != wants:
                raise Mismatch(name, serves)
            if inst is not None and vet is not None:
                await vet(inst)
            inst = self.find(name)
        except NotAdmitted as e:
            e.instance = None if inst is None else inst.name
            raise
        return Lease(inst, keep_alive, self.on_demand, self.daemon.instance)

    def find(self, name: str) -> InstanceRuntime:
        """The instance that serves `name`, started if it is on demand; raises NotAdmitted."""
        self.touched()
        inst = self.daemon.serving(name)
        if inst is None:
            raise Unknown(name)
        if inst.served_by is not None:
            raise ServedElsewhere(name, inst.served_by)
        if inst.state is not State.READY:
            if not inst.config.on_demand:
                raise NotServing(name, inst.state.value, inst.state is State.STOPPING)
            self.on_demand.ensure_started(inst)
            if self.on_demand.gives_up(inst):
                raise NotServing(name, inst.machine.reason or inst.state.value)
        return inst

    def unload(self, inst: InstanceRuntime) -> bool:
        """A request asks `inst` to stop once no request is in flight (keep_alive 0, nothing
        to generate), within its keep_alive floor. False when that cannot apply: an instance
        that is not on demand, or not running."""
        if not inst.config.on_demand or inst.state is not State.READY:
            return False
        inst.idle.finished(0.0)
        return True
