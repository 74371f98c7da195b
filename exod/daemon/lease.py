"""One request's hold on its instance, as `Traffic.admit` hands it to the HTTP layer.

Before it is entered, the lease names the instance found (an on-demand one is already being
started) and what its model can do. Entered (`async with lease`), it takes a place in the
instance's queue, waits there while the instance loads, and checks it is still the very same
instance and ready; then `open` sends work on rank 0's link, under the hang watch. On exit it
gives the place back and restarts the instance's idle clock with the keep-alive the request
asked for. Refusals are typed (exod.daemon.refusals).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import TYPE_CHECKING

from exod.core.states import State
from exod.daemon.admission import QueueFull
from exod.daemon.on_demand import OnDemand, Stopped
from exod.daemon.refusals import Busy, NotServing

if TYPE_CHECKING:
    from exod.daemon.channel import RequestStream, RunnerChannel
    from exod.daemon.instance import InstanceRuntime
    from exod.facts.caps import Capabilities
    from exod.wire import messages as m


class Lease:
    def __init__(self, inst: InstanceRuntime, keep_alive: float | None, on_demand: OnDemand,
                 current: Callable[[str], InstanceRuntime | None]) -> None:
        """`keep_alive`: the idle window the request asks for once it ends
        (exod.core.keep_alive), None: the instance's own; `current`: the instance the daemon
        holds by that name now."""
        self.instance = inst
        self.keep_alive = keep_alive
        self._on_demand = on_demand
        self._current = current
        self._link: RunnerChannel | None = None
        self._streams: list[RequestStream] = []
        self._held: contextlib.AbstractAsyncContextManager[RunnerChannel] | None = None

    async def capabilities(self) -> Capabilities:
        return await self.instance.lane.capabilities()

    @property
    def link(self) -> RunnerChannel:
        """Rank 0's link, once the lease is entered."""
        assert self._link is not None, "enter the lease first"
        return self._link

    def open(self, work: m.Work) -> RequestStream:
        """Send `work` on the runner's link (raises TooLarge); the stream is watched for a hang
        until the lease ends."""
        stream = self.link.open(work)
        self.instance.lane.opened(stream)
        self._streams.append(stream)
        return stream

    async def __aenter__(self) -> Lease:
        self._held = self._hold()
        self._link = await self._held.__aenter__()
        return self

    async def __aexit__(self, kind: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        for stream in self._streams:
            self.instance.lane.closed(stream)
        self._streams.clear()
        assert self._held is not None
        held, self._held, self._link = self._held, None, None
        await held.__aexit__(kind, e, tb)

    @contextlib.asynccontextmanager
    async def _hold(self) -> AsyncIterator[RunnerChannel]:
        inst = self.instance
        gate = inst.lane.gate
        try:
            await gate.enter()
        except QueueFull:
            raise Busy(inst.name, inst.width, inst.config.max_queue) from None
        try:
            try:  # an on-demand instance may still be loading: wait for it, in the queue
                await self._on_demand.until_ready(inst)
            except Stopped as e:
                raise NotServing(inst.name, inst.machine.reason or str(e)) from None
            # Waiting may have taken a while: ready still, and the very same instance?
            if self._current(inst.name) is not inst or inst.state is not State.READY:
                raise NotServing(inst.name, "replaced by a reload")
            link = inst.serving_link()
            if link is None:
                raise NotServing(inst.name, "its runner is gone")
            yield link
        finally:
            gate.leave()
            inst.idle.finished(self.keep_alive)
