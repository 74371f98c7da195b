"""Requests to instances, the daemon's side. Which instance serves a model name (an on-demand
one is started), a place in its admission queue, the wait while it loads, its runner's link,
and the hang watch over its streams. The HTTP layer asks here and relays the events; what is
kept per instance (gate, hang watch, the model's size) lives here, in one lane per runtime,
dropped when a reload retires the runtime. Refusals are typed (`Refused`): the HTTP layer words
them."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from exod.facts.embed import Role, role
from exod.facts.caps import Capabilities, model_capabilities
from exod.facts.model_dir import model_limits
from exod.facts.details import ModelFacts, model_facts
from exod.core.states import State
from exod.daemon.admission import Gate, QueueFull
from exod.daemon.hang import HangWatch
from exod.daemon.on_demand import Daemon as OnDemandDaemon
from exod.daemon.on_demand import OnDemand, Stopped

if TYPE_CHECKING:
    from exod.daemon.channel import RequestStream, RunnerChannel
    from exod.daemon.instance import InstanceRuntime


class Daemon(OnDemandDaemon, Protocol):
    """What requests need of the daemon."""

    def instance(self, name: str) -> InstanceRuntime | None: ...

    def serving(self, name: str) -> InstanceRuntime | None:
        """The instance a request's `model` names (its own name or an alias)."""
        ...


class Refused(Exception):
    """Why a request for `name` is not served."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


class Unknown(Refused):
    """No instance has this name."""


class ServedElsewhere(Refused):
    """Its rank 0 runs on `host`, whose exod serves it."""

    def __init__(self, name: str, host: str) -> None:
        super().__init__(name)
        self.host = host


class NotServing(Refused):
    """Not ready, and not about to be for this request (`detail` says what it is)."""

    def __init__(self, name: str, detail: str, stopping: bool = False) -> None:
        super().__init__(name)
        self.detail = detail
        self.stopping = stopping


class Mismatch(Refused):
    """The instance serves another kind of request (`serves`: what its model is for)."""

    def __init__(self, name: str, serves: Role) -> None:
        super().__init__(name)
        self.serves = serves


class Busy(Refused):
    """`limit` requests at the runner and `queue` waiting: the most it takes."""

    def __init__(self, name: str, limit: int, queue: int) -> None:
        super().__init__(name)
        self.limit = limit
        self.queue = queue


ModelSize = tuple[int | None, int | None]  # (vocabulary, context window); None: unknown


@dataclass
class Lane:
    """What is kept of one runtime's requests."""

    gate: Gate
    watch: HangWatch | None  # None: hang_after is never
    size: ModelSize | None = None  # from its config.json, read once
    caps: Capabilities | None = None  # from its tokenizer files, once they tell
    role: Role | None = None  # what its model serves, once its files are there
    facts: tuple[Path, ModelFacts] | None = None  # of its files, once they are there


class Traffic:
    def __init__(self, daemon: Daemon, touched: Callable[[], None] = lambda: None) -> None:
        self.daemon = daemon
        self.touched = touched  # a request came: memory was taken and will be freed
        self.lanes: dict[InstanceRuntime, Lane] = {}
        self.on_demand = OnDemand(daemon, self.gate_of)
        self.last_request: dict[str, float] = {}  # instance → when it last served one

    def gate_of(self, inst: InstanceRuntime) -> Gate | None:
        lane = self.lanes.get(inst)
        return lane.gate if lane is not None else None

    def load(self, inst: InstanceRuntime) -> tuple[int, int]:
        """(requests at the runner, requests waiting)."""
        gate = self.gate_of(inst)
        return (gate.active, gate.waiting) if gate is not None else (0, 0)

    def changed(self, inst: InstanceRuntime) -> None:
        """Requests queued for an instance that can no longer serve them are refused; the
        idle clock of an on-demand instance starts once it is ready."""
        lane = self.lanes.get(inst)
        if lane is not None and self.on_demand.gives_up(inst):
            lane.gate.reject_waiting(lambda: NotServing(inst.name, inst.state.value,
                                                        inst.state is State.STOPPING))
        if inst.state is State.READY and inst.config.on_demand:
            self.on_demand.used(inst)
        if inst.retired:
            self.lanes.pop(inst, None)

    def _lane(self, inst: InstanceRuntime) -> Lane:
        lane = self.lanes.get(inst)
        if lane is None:
            watch = None if math.isinf(inst.config.hang_after) else HangWatch(
                self.daemon, inst.config.hang_after, inst.hang)
            lane = Lane(Gate(inst.width, inst.config.max_queue), watch)
            if not inst.retired:  # nothing would drop it
                self.lanes[inst] = lane
        elif lane.gate.limit != inst.width:
            lane.gate.resize(inst.width)
        return lane

    # ---- one request ----------------------------------------------------------------------
    async def expect(self, name: str, wants: Role) -> None:
        """Mismatch when the instance `name` serves another kind of request than `wants` (told
        by its model's files, before `find` may start it)."""
        inst = self.daemon.serving(name)  # by its name or an alias
        serves = None if inst is None else await self.serves(inst)
        if serves is not None and serves != wants:
            raise Mismatch(name, serves)

    def find(self, name: str) -> InstanceRuntime:
        """The instance that serves `name`, started if it is on demand; raises Refused."""
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

    async def size(self, inst: InstanceRuntime) -> ModelSize:
        """The model's vocabulary and context window from its config.json, read once per
        runtime, off the loop."""
        lane = self._lane(inst)
        if lane.size is None:
            lane.size = await asyncio.to_thread(model_limits, inst.config.model)
        return lane.size

    async def serves(self, inst: InstanceRuntime) -> Role | None:
        """What the instance's model serves (exod.facts.embed), from its files, off the loop;
        None while they are not there (a model on the hub not fetched yet)."""
        lane = self._lane(inst)
        model = inst.config.model  # a hub model's name until it is fetched
        if lane.role is None and await asyncio.to_thread((model / "config.json").is_file):
            lane.role = await asyncio.to_thread(role, model)
        return lane.role

    async def capabilities(self, inst: InstanceRuntime) -> Capabilities:
        """What the model can do for a client (tools, thinking), from its tokenizer files,
        off the loop; kept once they tell (a model named on the hub may not be there yet)."""
        lane = self._lane(inst)
        if lane.caps is None:
            caps = await asyncio.to_thread(model_capabilities, inst.config.model)
            if caps.tools is None:
                return caps
            lane.caps = caps
        return lane.caps

    async def facts(self, inst: InstanceRuntime, model_dir: Path) -> ModelFacts:
        """What Ollama's clients are told of the model's files (exod.facts.details),
        read off the loop once per runtime and folder (a hub model's folder is its snapshot)."""
        lane = self._lane(inst)
        if lane.facts is not None and lane.facts[0] == model_dir:
            return lane.facts[1]
        facts = await asyncio.to_thread(model_facts, model_dir)
        if facts.size:
            lane.facts = (model_dir, facts)
        return facts

    @contextlib.asynccontextmanager
    async def slot(self, inst: InstanceRuntime,
                   keep_alive: float | None = None) -> AsyncIterator[RunnerChannel]:
        """A place at `inst`'s runner, waiting in its queue (and for an on-demand start):
        yields the link to send the request on; raises Refused. `keep_alive`: the idle window
        the request asks for once it ends (exod.core.keep_alive), None: the instance's own."""
        gate = self._lane(inst).gate
        try:
            await gate.enter()
        except QueueFull:
            raise Busy(inst.name, gate.limit, gate.queue) from None
        try:
            try:  # an on-demand instance may still be loading: wait for it, in the queue
                await self.on_demand.until_ready(inst)
            except Stopped as e:
                raise NotServing(inst.name, inst.machine.reason or str(e)) from None
            # Waiting may have taken a while: ready still, and the very same instance?
            if self.daemon.instance(inst.name) is not inst or inst.state is not State.READY:
                raise NotServing(inst.name, "replaced by a reload")
            link = inst.serving_link()
            if link is None:
                raise NotServing(inst.name, "its runner is gone")
            yield link
        finally:
            gate.leave()
            self.last_request[inst.name] = self.daemon.now()
            if inst.config.on_demand:
                self.on_demand.finished(inst, keep_alive)

    def unload(self, inst: InstanceRuntime) -> bool:
        """A request asks `inst` to stop once no request is in flight (keep_alive 0, nothing
        to generate), within its keep_alive floor. False when that cannot apply: an instance
        that is not on demand, or not running."""
        if not inst.config.on_demand or inst.state is not State.READY:
            return False
        self.on_demand.finished(inst, 0.0)
        return True

    @contextlib.contextmanager
    def watching(self, inst: InstanceRuntime, stream: RequestStream) -> Iterator[None]:
        """Watch `stream` for a hang while the runner serves it (progress counts as events
        arrive, read or not)."""
        watch = self._lane(inst).watch
        if watch is None:
            yield
            return
        watch.opened(stream)
        stream.on_event = watch.progress
        try:
            yield
        finally:
            watch.closed(stream)
