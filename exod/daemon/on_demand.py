"""On-demand instances: started by their first request, and evicted for room.

A request for a stopped on-demand instance starts it and waits (holding its place in the
instance's queue) until it is ready. When memory admission would refuse it, idle on-demand
instances are stopped first, least recently used first (by their idle clocks,
exod.daemon.idle), if that frees enough; an instance that is always on, or on demand with
`evictable: false`, is never evicted. Nothing is kept here per instance: a start waiting for
room is its lane's (exod.daemon.lane), its idle stop its idle clock's.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from loguru import logger

from exod.core.states import State
from exod.daemon.clock import Clock

if TYPE_CHECKING:
    from exod.daemon.instance import InstanceRuntime


class Fleet(Clock, Protocol):
    """The daemon's instances, as on-demand starts and evictions see them."""

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
    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    # ---- starting -------------------------------------------------------------------------
    def ensure_started(self, inst: InstanceRuntime) -> None:
        """Start an on-demand instance that is not running (nor about to), making room first."""
        inst.idle.last_used = self.fleet.now()
        startable = inst.state is State.STOPPED or (
            inst.state is State.FAILED and bool(inst.refused))  # memory may have freed since
        if not startable or self.fleet.stopping or inst.start_pending or inst.lane.making_room:
            return
        inst.idle.asked = None  # a new run: what the last one was asked is over
        victims = self._victims(inst, self.fleet.missing_memory(inst))
        if not victims:
            inst.start()  # fits, or cannot be made to fit: admission says which
            return
        left = {v.name for v in victims}
        logger.bind(instance=inst.name).info("making room: stopping idle {}",
                                             ", ".join(sorted(left)))
        inst.lane.making_room = True

        def stopped(name: str) -> None:
            left.discard(name)
            if not left:
                inst.lane.making_room = False
                if not self.fleet.stopping and not inst.retired:
                    inst.start()

        for v in victims:
            v.stop(then=functools.partial(stopped, v.name))

    def _victims(self, inst: InstanceRuntime, missing: int) -> list[InstanceRuntime]:
        """Idle on-demand instances to stop, oldest use first, freeing at least `missing`
        bytes; none when nothing is missing or even all of them would not be enough."""
        if missing <= 0:
            return []
        idle = sorted((o for o in self.fleet.ordered() if o is not inst and o.config.on_demand
                       and o.config.evictable and o.state is State.READY and not o.lane.busy),
                      key=lambda o: o.idle.last_used or 0.0)
        chosen, freed = [], 0
        for o in idle:
            chosen.append(o)
            freed += o.memory_need or 0
            if freed >= missing:
                return chosen
        return []

    def gives_up(self, inst: InstanceRuntime) -> bool:
        return not inst.lane.making_room and gives_up(inst)

    async def until_ready(self, inst: InstanceRuntime) -> None:
        """Wait for READY; raises Stopped when the instance settles otherwise."""
        changed: asyncio.Queue[None] = asyncio.Queue()
        unlisten = self.fleet.listen(lambda i: changed.put_nowait(None) if i is inst else None)
        try:
            while inst.state is not State.READY:
                if self.gives_up(inst):
                    raise Stopped(inst.state.value)
                await changed.get()
        finally:
            unlisten()
