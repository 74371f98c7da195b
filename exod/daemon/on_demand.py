"""On-demand instances: started by their first request, stopped when idle, evicted for room.

A request for a stopped on-demand instance starts it and waits (holding its place in the
instance's queue) until it is ready. `idle_stop_after` stops it through the ladder once no
request has come for that long; a request's own keep-alive (Ollama's `keep_alive`), within the
instance's bounds, sets that window until the next request ends (0: stop once no request is in
flight, which a later request that asks nothing does not undo). When memory admission would
refuse it, idle on-demand instances are stopped first, least recently used first, if that frees
enough; an instance that is always on, or on demand with `evictable: false`, is never evicted.
Every timer runs on the seam's clock.
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from loguru import logger

from exod.core.durations import format_duration
from exod.core.keep_alive import bounded
from exod.core.states import State
from exod.daemon.clock import Clock, Timer

if TYPE_CHECKING:
    from exod.daemon.admission import Gate
    from exod.daemon.instance import InstanceRuntime


class Daemon(Clock, Protocol):
    """What on-demand starts and idle stops need of the daemon."""

    @property
    def stopping(self) -> bool: ...

    def ordered(self) -> Sequence[InstanceRuntime]: ...

    def listen(self, fn: Callable[[InstanceRuntime], None]) -> Callable[[], None]: ...

    def missing_memory(self, inst: InstanceRuntime) -> int:
        """Bytes short of what `inst` needs to start here now (0 or less: it fits)."""
        ...


class Stopped(Exception):
    """The instance settled without becoming ready; carries its state for the 503."""


def gives_up(inst: InstanceRuntime) -> bool:
    """No request waiting for this instance can be served by it any more."""
    if inst.retired or inst.state is State.FAILED:
        return True
    if inst.state is State.STOPPED:
        return not inst.start_pending
    if inst.config.on_demand:
        return False  # stopping or backing off: a start follows (or a stop that settles)
    return inst.state is not State.READY


class OnDemand:
    def __init__(self, daemon: Daemon, gate_of: Callable[[InstanceRuntime], Gate | None]) -> None:
        self.daemon = daemon
        self.gate_of = gate_of
        self.last_used: dict[str, float] = {}
        self._asked: dict[str, float] = {}  # the idle window the last request set, bounded
        self._idle_timers: dict[str, tuple[float, Timer]] = {}  # when it is due, and its timer
        self._making_room: set[InstanceRuntime] = set()  # start once their victims are gone

    # ---- starting -------------------------------------------------------------------------
    def ensure_started(self, inst: InstanceRuntime) -> None:
        """Start an on-demand instance that is not running (nor about to), making room first."""
        self.last_used[inst.name] = self.daemon.now()
        startable = inst.state is State.STOPPED or (
            inst.state is State.FAILED and bool(inst.refused))  # memory may have freed since
        if not startable or self.daemon.stopping or inst.start_pending or (
                inst in self._making_room):
            return
        self._asked.pop(inst.name, None)  # a new run: what the last one was asked is over
        victims = self._victims(inst, self.daemon.missing_memory(inst))
        if not victims:
            inst.start()  # fits, or cannot be made to fit: admission says which
            return
        left = {v.name for v in victims}
        logger.bind(instance=inst.name).info("making room: stopping idle {}",
                                             ", ".join(sorted(left)))
        self._making_room.add(inst)

        def stopped(name: str) -> None:
            left.discard(name)
            if not left:
                self._making_room.discard(inst)
                if not self.daemon.stopping and not inst.retired:
                    inst.start()

        for v in victims:
            v.stop(then=functools.partial(stopped, v.name))

    def _victims(self, inst: InstanceRuntime, missing: int) -> list[InstanceRuntime]:
        """Idle on-demand instances to stop, oldest use first, freeing at least `missing`
        bytes; none when nothing is missing or even all of them would not be enough."""
        if missing <= 0:
            return []
        idle = sorted((o for o in self.daemon.ordered() if o is not inst and o.config.on_demand
                       and o.config.evictable and o.state is State.READY and self._idle(o)),
                      key=lambda o: self.last_used.get(o.name, 0.0))
        chosen, freed = [], 0
        for o in idle:
            chosen.append(o)
            freed += o.memory_need or 0
            if freed >= missing:
                return chosen
        return []

    def _idle(self, inst: InstanceRuntime) -> bool:
        gate = self.gate_of(inst)
        return gate is None or (gate.active == 0 and gate.waiting == 0)

    def gives_up(self, inst: InstanceRuntime) -> bool:
        return inst not in self._making_room and gives_up(inst)

    async def until_ready(self, inst: InstanceRuntime) -> None:
        """Wait for READY; raises Stopped when the instance settles otherwise."""
        changed: asyncio.Queue[None] = asyncio.Queue()
        unlisten = self.daemon.listen(lambda i: changed.put_nowait(None) if i is inst else None)
        try:
            while inst.state is not State.READY:
                if self.gives_up(inst):
                    raise Stopped(inst.state.value)
                await changed.get()
        finally:
            unlisten()

    # ---- idle stop ------------------------------------------------------------------------
    def window(self, inst: InstanceRuntime) -> float:
        """How long `inst` stays up with no request: what the last request asked for (within
        the instance's keep_alive bounds), else its `idle_stop_after`."""
        asked = self._asked.get(inst.name)
        return inst.config.idle_stop_after if asked is None else asked

    def finished(self, inst: InstanceRuntime, keep_alive: float | None = None) -> None:
        """A request ended; `keep_alive`: the idle window it asked for (seconds, math.inf:
        never, 0: stop once idle), None: none. Restarts the idle clock."""
        if keep_alive is not None:
            self._asked[inst.name] = bounded(keep_alive, inst.config.keep_alive)
        elif self._asked.get(inst.name) != 0:  # a stop asked for waits for the in-flight ones
            self._asked.pop(inst.name, None)
        self.used(inst)

    def used(self, inst: InstanceRuntime) -> None:
        """A request finished (or the instance became ready): restart the idle clock."""
        self.last_used[inst.name] = now = self.daemon.now()
        if not inst.config.on_demand:
            return
        old = self._idle_timers.pop(inst.name, None)
        if old is not None:
            old[1].cancel()
        after = self.window(inst)
        if not math.isinf(after):
            self._idle_timers[inst.name] = (now + after, self.daemon.call_at(
                now + after, lambda: self._idle_due(inst)))

    def stops_at(self, inst: InstanceRuntime) -> float:
        """When `inst` is due to stop for want of requests, on the seam's clock (math.inf:
        never, as an instance that is always on, or whose window is never)."""
        due = self._idle_timers.get(inst.name)
        return due[0] if due is not None else math.inf

    def _idle_due(self, inst: InstanceRuntime) -> None:
        self._idle_timers.pop(inst.name, None)
        if inst.retired or inst.state is not State.READY or not self._idle(inst):
            return  # busy now: the request that is running will restart the clock
        idle_for = self.daemon.now() - self.last_used.get(inst.name, 0.0)
        asked = " (as a request's keep_alive asked)" if inst.name in self._asked else ""
        inst.log.info("idle for {}{}: stopping until the next request", format_duration(idle_for),
                      asked)
        self._asked.pop(inst.name, None)
        inst.stop()
