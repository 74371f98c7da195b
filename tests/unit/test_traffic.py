"""The daemon's side of requests (exod.daemon.traffic, and what each instance holds of them:
exod.daemon.lane, exod.daemon.idle, exod.daemon.lease), on the fake seam's clock: the admission
gate, on-demand starts and the wait in the queue, idle stops, eviction for room, hang watches,
and refusals once an instance cannot serve. The instances are real runtimes driven through
`FakeDaemon`; only the gate's waiters need an event loop (its futures), never its time."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from exod.config.schema import Instance, KeepAliveBounds, StopPolicy
from exod.core.shards import pipeline_shards
from exod.core.states import State
from exod.daemon.admission import Gate, QueueFull
from exod.daemon.hang import HangWatch
from exod.daemon.instance import InstanceRuntime
from exod.daemon.on_demand import OnDemand
from exod.daemon.refusals import Busy, NotServing, ServedElsewhere, Unknown
from exod.wire import messages as m
from tests.unit.fakes import ASK, FakeDaemon, FakeLink, FakeSeam

STOP = StopPolicy(grace=10.0, drain=0.0, attempts=1, interval=5.0, kill_interval=1.0)


def runtime(daemon: FakeDaemon, name: str, *, on_demand: bool = True, **kw: Any) -> InstanceRuntime:
    cfg = Instance(name=name, model=Path("/m"), autostart="on-demand" if on_demand else True,
                   restart="no", stop=STOP, **kw)
    return daemon.add(InstanceRuntime(cfg, pipeline_shards(4, 1), daemon))


def loaded(daemon: FakeDaemon, inst: InstanceRuntime) -> int:
    (pid,) = daemon.pids(inst)
    daemon.load(pid)
    assert inst.state is State.READY
    return pid


# ---- the admission gate ------------------------------------------------------------------------
def test_gate_limits_queues_refuses_and_hands_over_in_order() -> None:
    async def scenario() -> None:
        gate = Gate(limit=2, queue=2)
        await gate.enter()
        await gate.enter()
        order: list[int] = []

        async def waiter(i: int) -> None:
            await gate.enter()
            order.append(i)

        w1 = asyncio.create_task(waiter(1))
        w2 = asyncio.create_task(waiter(2))
        await asyncio.sleep(0)
        assert gate.waiting == 2
        with pytest.raises(QueueFull):
            await gate.enter()
        gate.leave()
        await w1
        gate.leave()
        await w2
        assert order == [1, 2] and gate.active == 2
        gate.leave()
        gate.leave()
        assert gate.active == 0 and gate.waiting == 0

    asyncio.run(scenario())


def test_gate_widened_by_memory_admission_lets_waiters_in() -> None:
    async def scenario() -> None:
        gate = Gate(limit=1, queue=4)  # an on-demand instance: its width is known at its start
        await gate.enter()
        waiters = [asyncio.create_task(gate.enter()) for _ in range(3)]
        await asyncio.sleep(0)
        assert gate.waiting == 3
        gate.resize(3)
        await asyncio.gather(*waiters[:2])
        assert gate.active == 3 and gate.waiting == 1
        gate.leave()
        await waiters[2]
        assert gate.active == 3

    asyncio.run(scenario())


def test_gate_cancelled_waiter_leaves_and_rejection_fails_waiters() -> None:
    async def scenario() -> None:
        gate = Gate(limit=1, queue=4)
        await gate.enter()
        gone = asyncio.create_task(gate.enter())
        stays = asyncio.create_task(gate.enter())
        await asyncio.sleep(0)
        gone.cancel()
        await asyncio.sleep(0)
        assert gate.waiting == 1
        gate.leave()  # goes to `stays`, not to the cancelled one
        await stays
        assert gate.active == 1
        rejected = asyncio.create_task(gate.enter())
        await asyncio.sleep(0)
        gate.reject_waiting(lambda: RuntimeError("not ready"))
        with pytest.raises(RuntimeError):
            await rejected
        gate.leave()
        assert gate.active == 0 and gate.waiting == 0

    asyncio.run(scenario())


def test_gate_narrowed_hands_no_slot_over_until_below_its_limit() -> None:
    async def scenario() -> None:
        gate = Gate(limit=3, queue=2)
        for _ in range(3):
            await gate.enter()
        gate.resize(1, 4)  # the runner's engine stopped taking the queue (it restarted)
        waiter = asyncio.create_task(gate.enter())
        await asyncio.sleep(0)
        gate.leave()
        gate.leave()
        await asyncio.sleep(0)
        assert not waiter.done() and gate.active == 1 and gate.queue == 4
        gate.leave()
        await waiter
        assert gate.active == 1

    asyncio.run(scenario())


def test_an_engine_that_shares_its_batch_is_sent_the_queue() -> None:
    """Its requests wait in the engine, which picks whom to start (exod.runner.serving.
    fair_share): width + max_queue go to the runner, none wait here, the next is refused, and
    the load still says how many are in the batch and how many wait."""
    daemon = FakeDaemon()
    inst = runtime(daemon, "g", on_demand=False, max_concurrency=2, max_queue=3)
    inst.start()
    loaded(daemon, inst)
    assert (inst.lane.gate.limit, inst.lane.gate.queue) == (2, 3)  # not said yet: here
    inst.ranks[0].serving = m.ServingReport(batching="continuous", width=2, active=0, fair=True)
    assert (inst.lane.gate.limit, inst.lane.gate.queue) == (5, 0)

    async def scenario() -> None:
        for _ in range(5):
            await inst.lane.gate.enter()
        assert inst.lane.load() == (2, 3)
        with pytest.raises(QueueFull):
            await inst.lane.gate.enter()

    asyncio.run(scenario())


# ---- hang watches ------------------------------------------------------------------------------
class FakeStream:
    def __init__(self) -> None:
        self.failed: list[tuple[str, str]] = []
        self.finished = False

    def fail(self, code: str, message: str) -> None:
        self.failed.append((code, message))


def test_hang_watch_fires_only_without_progress_while_in_flight() -> None:
    seam = FakeSeam()
    hung: list[float] = []
    watch = HangWatch(seam, 1.0, hung.append)
    a, b = FakeStream(), FakeStream()
    watch.opened(a)  # type: ignore[arg-type]
    for _ in range(8):  # progress keeps it alive past a window
        seam.advance(0.2)
        watch.progress()
    assert not hung
    watch.opened(b)  # type: ignore[arg-type]
    seam.advance(1.0)
    (silent,) = hung
    assert silent >= 1.0
    assert a.failed and a.failed[0][0] == "hung" and b.failed[0][0] == "hung"
    assert "no progress for" in a.failed[0][1]
    # Nothing in flight: no timer, nothing fires.
    hung_again: list[float] = []
    idle = HangWatch(seam, 0.05, hung_again.append)
    s = FakeStream()
    idle.opened(s)  # type: ignore[arg-type]
    idle.closed(s)  # type: ignore[arg-type]
    assert idle._timer is None
    seam.advance(10.0)
    assert hung_again == [] and len(hung) == 1


def test_hang_watch_ignores_requests_the_runner_is_done_with() -> None:
    """A handler still writing to a client that stopped reading keeps its stream open after
    the runner finished it (or it was cut off): that is no request in flight."""
    seam = FakeSeam()
    hung: list[float] = []
    watch = HangWatch(seam, 0.05, hung.append)
    stuck = FakeStream()
    watch.opened(stuck)  # type: ignore[arg-type]
    stuck.finished = True
    seam.advance(0.3)  # several windows of the watch's own pace
    assert hung == [] and watch._timer is not None  # still watching, for new requests
    late = FakeStream()
    watch.opened(late)  # type: ignore[arg-type]
    seam.advance(0.3)
    assert hung and late.failed and "with 1 request(s) in flight" in late.failed[0][1]


def test_a_hang_restarts_the_instance_through_the_ladder() -> None:
    daemon = FakeDaemon()
    inst = runtime(daemon, "a", on_demand=False, hang_after=5.0)
    inst.start()
    pid = loaded(daemon, inst)
    stream = FakeStream()
    with inst.lane.watching(stream):  # type: ignore[arg-type]
        daemon.advance(5.0)
        assert stream.failed and stream.failed[0][0] == "hung"
    assert inst.state is State.STOPPING and inst.hung == "hung (no progress for 5s)"
    assert daemon.steps(pid) == [(daemon.now(), ASK)]


# ---- eviction ----------------------------------------------------------------------------------
def instance(name: str, state: State, need: int, on_demand: bool = True,
             last_used: float | None = None, busy: bool = False) -> Any:
    cfg = Instance(name=name, model=Path("/m"), autostart="on-demand" if on_demand else True)
    return SimpleNamespace(name=name, state=state, config=cfg, memory_need=need,
                           idle=SimpleNamespace(last_used=last_used),
                           lane=SimpleNamespace(busy=busy))


def test_eviction_takes_idle_on_demand_instances_least_recently_used_first() -> None:
    new = instance("new", State.STOPPED, 50)
    old = instance("old", State.READY, 30, last_used=1.0)
    mid = instance("mid", State.READY, 30, last_used=2.0)
    busy = instance("busy", State.READY, 100, last_used=0.5, busy=True)  # a request at it
    always = instance("always", State.READY, 500, on_demand=False)
    loading = instance("loading", State.LOADING, 100)
    daemon = SimpleNamespace(ordered=lambda: [new, old, mid, busy, always, loading])
    od = OnDemand(daemon)  # type: ignore[arg-type]
    assert od._victims(new, 0) == []  # it fits
    assert od._victims(new, 20) == [old]
    assert od._victims(new, 50) == [old, mid]
    assert od._victims(new, 61) == []  # even all idle on-demand ones would not make room


def test_room_is_made_then_the_instance_starts() -> None:
    daemon = FakeDaemon()
    old, new = runtime(daemon, "old"), runtime(daemon, "new")
    daemon.traffic.find("old")
    pid = loaded(daemon, old)
    old.memory_need = 20
    daemon.missing["new"] = 10
    daemon.advance(1.0)
    assert daemon.traffic.find("new") is new  # waits: room is being made
    assert old.state is State.STOPPING and daemon.steps(pid) == [(daemon.now(), ASK)]
    assert new.state is State.STOPPED and not daemon.traffic.on_demand.gives_up(new)
    daemon.exit(pid, code=0)
    assert old.state is State.STOPPED and new.state is State.STARTING


# ---- on-demand starts and idle stops -----------------------------------------------------------
def test_a_request_starts_an_on_demand_instance_and_waits_for_it_in_the_queue() -> None:
    daemon = FakeDaemon()
    inst = runtime(daemon, "a")
    traffic = daemon.traffic

    async def scenario() -> FakeLink:
        lease = await traffic.admit("a", None)
        assert lease.instance is inst and inst.state is State.STARTING
        async with lease:
            return lease.link  # type: ignore[return-value]

    async def load_later() -> FakeLink:
        request = asyncio.create_task(scenario())
        await asyncio.sleep(0)
        assert not request.done() and inst.lane.load() == (1, 0)  # its slot, while loading
        loaded(daemon, inst)
        return await request

    link = asyncio.run(load_later())
    assert link == FakeLink(daemon.pids(inst)[0]) and inst.lane.load() == (0, 0)


def test_a_request_the_http_layer_refuses_by_the_model_starts_nothing() -> None:
    """Its `vet` (e.g. Ollama's `think` for a model that does not think) runs before an
    on-demand instance is started for it."""
    daemon = FakeDaemon()
    inst = runtime(daemon, "a")

    async def refuse(seen: InstanceRuntime) -> None:
        assert seen is inst
        raise ValueError("the model cannot do that")

    with pytest.raises(ValueError):
        asyncio.run(daemon.traffic.admit("a", None, vet=refuse))
    assert inst.state is State.STOPPED and all(r.pid is None for r in inst.ranks)


def test_an_idle_on_demand_instance_stops_after_its_window_and_a_busy_one_does_not() -> None:
    daemon = FakeDaemon()
    inst = runtime(daemon, "a", idle_stop_after=60.0)
    daemon.traffic.find("a")
    pid = loaded(daemon, inst)  # the idle clock starts once it is ready
    gate = inst.lane.gate
    gate.active = 1  # a request at the runner past the window: not idle
    daemon.advance(60.0)
    assert inst.state is State.READY
    gate.active = 0
    inst.idle.used()  # what the request's end does
    daemon.advance(59.0)
    assert inst.state is State.READY
    daemon.advance(1.0)
    assert inst.state is State.STOPPING and daemon.steps(pid) == [(daemon.now(), ASK)]
    daemon.exit(pid, code=0)
    assert inst.state is State.STOPPED and daemon.pending() == []


def test_a_requests_keep_alive_sets_the_window_until_the_next_request() -> None:
    daemon = FakeDaemon()
    inst = runtime(daemon, "a", idle_stop_after=600.0)
    idle = inst.idle
    daemon.traffic.find("a")
    pid = loaded(daemon, inst)
    assert idle.stops_at() == daemon.now() + 600
    idle.finished(30.0)  # a request that asked keep_alive 30s
    assert idle.window() == 30 and idle.stops_at() == daemon.now() + 30
    daemon.advance(20.0)
    idle.finished()  # the next one asked nothing: idle_stop_after again
    assert idle.window() == 600
    daemon.advance(599.0)
    assert inst.state is State.READY
    idle.finished(math.inf)  # keep_alive -1: never
    assert idle.stops_at() == math.inf
    daemon.advance(10_000.0)
    assert inst.state is State.READY and daemon.pending() == []
    idle.finished(5.0)
    daemon.advance(5.0)
    assert inst.state is State.STOPPING and daemon.steps(pid) == [(daemon.now(), ASK)]


def test_keep_alive_within_the_operators_floor_and_ceiling() -> None:
    daemon = FakeDaemon()
    inst = runtime(daemon, "a", keep_alive=KeepAliveBounds(min=60.0, max=3600.0))
    idle = inst.idle
    daemon.traffic.find("a")
    pid = loaded(daemon, inst)
    assert idle.stops_at() == math.inf  # idle_stop_after never, asked nothing
    idle.finished(math.inf)  # -1: kept as long as the ceiling lets it
    assert idle.window() == 3600
    idle.finished(0.0)  # 0: no sooner than the floor
    assert idle.window() == 60
    daemon.advance(59.0)
    assert inst.state is State.READY
    daemon.advance(1.0)
    assert inst.state is State.STOPPING and daemon.steps(pid) == [(daemon.now(), ASK)]


def test_keep_alive_0_stops_once_the_requests_in_flight_end() -> None:
    daemon = FakeDaemon()
    inst = runtime(daemon, "a")
    traffic = daemon.traffic
    traffic.find("a")
    pid = loaded(daemon, inst)
    gate = inst.lane.gate
    gate.active = 1  # another request at the runner
    inst.idle.finished(0.0)
    daemon.advance(0.0)
    assert inst.state is State.READY  # not while it runs
    gate.active = 0
    inst.idle.finished()  # it ends, asking nothing: the stop asked for stands
    daemon.advance(0.0)
    assert inst.state is State.STOPPING and daemon.steps(pid) == [(daemon.now(), ASK)]
    daemon.exit(pid, code=0)
    traffic.find("a")  # the next request starts it with its own window again
    loaded(daemon, inst)
    assert inst.idle.window() == math.inf


def test_unload_applies_to_a_running_on_demand_instance_only() -> None:
    daemon = FakeDaemon()
    inst, always = runtime(daemon, "a"), runtime(daemon, "b", on_demand=False)
    assert not daemon.traffic.unload(inst)  # not running: nothing to stop (and no start)
    assert inst.state is State.STOPPED
    daemon.traffic.find("a")
    pid = loaded(daemon, inst)
    always.start()
    loaded(daemon, always)
    assert not daemon.traffic.unload(always)
    assert daemon.traffic.unload(inst)
    daemon.advance(0.0)
    assert inst.state is State.STOPPING and daemon.steps(pid) == [(daemon.now(), ASK)]
    assert always.state is State.READY


def test_an_always_on_instance_has_no_idle_clock() -> None:
    daemon = FakeDaemon()
    inst = runtime(daemon, "a", on_demand=False)
    inst.start()
    loaded(daemon, inst)
    assert daemon.pending() == []
    inst.stop()
    with pytest.raises(NotServing) as stopping:  # nor started by a request
        daemon.traffic.find("a")
    assert stopping.value.stopping and inst.state is State.STOPPING


# ---- refusals ----------------------------------------------------------------------------------
def test_refusals_name_the_instance_and_why() -> None:
    daemon = FakeDaemon()
    inst = runtime(daemon, "a", on_demand=False, max_concurrency=1, max_queue=1)
    with pytest.raises(Unknown):
        daemon.traffic.find("nope")
    with pytest.raises(NotServing) as stopped:
        daemon.traffic.find("a")
    assert stopped.value.detail == "stopped" and not stopped.value.stopping
    inst.ranks[0].local, inst.ranks[0].host = False, "peer"
    with pytest.raises(ServedElsewhere) as elsewhere:
        daemon.traffic.find("a")
    assert elsewhere.value.host == "peer"


def test_a_request_finds_an_instance_by_alias_or_tagged_name() -> None:
    daemon = FakeDaemon()
    inst = runtime(daemon, "a", aliases=("llama3.2", "qwen3:8b"))
    for name in ("a", "a:latest", "llama3.2:latest", "qwen3:8b"):
        assert daemon.traffic.find(name) is inst, name
    with pytest.raises(Unknown) as unknown:
        daemon.traffic.find("qwen3")
    assert unknown.value.name == "qwen3"


def test_waiters_are_refused_when_the_queue_is_full_or_the_instance_stops_serving() -> None:
    daemon = FakeDaemon()
    inst = runtime(daemon, "a", on_demand=False, max_concurrency=1, max_queue=1)
    inst.start()
    pid = loaded(daemon, inst)
    traffic = daemon.traffic

    async def request() -> None:
        async with await traffic.admit("a", None):
            await asyncio.Event().wait()  # at the runner until cancelled

    async def scenario() -> None:
        first = asyncio.create_task(request())
        await asyncio.sleep(0)
        queued = asyncio.create_task(request())
        await asyncio.sleep(0)
        with pytest.raises(Busy) as busy:
            await request()
        assert (busy.value.limit, busy.value.queue) == (1, 1)
        daemon.exit(pid, code=1)  # restart: no → failed: the queued one is refused
        with pytest.raises(NotServing) as refused:
            await queued
        assert refused.value.detail == "failed"
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        assert inst.lane.load() == (0, 0)

    asyncio.run(scenario())


def test_a_retired_runtime_drops_its_lane() -> None:
    """Its lane and idle clock are its own: nothing of it is kept beside it, by runtime or by
    name, for a replacement of the same name to inherit."""
    daemon = FakeDaemon()
    inst = runtime(daemon, "a", on_demand=False)
    inst.start()
    pid = loaded(daemon, inst)
    lane = inst.lane
    inst.retire(replacement=None)
    daemon.exit(pid, code=0)
    assert inst.retired and inst.lane is lane
    for part in (daemon.traffic, daemon.traffic.on_demand):
        assert not [v for v in vars(part).values() if isinstance(v, (dict, set, list)) and v]
    assert runtime(daemon, "a", on_demand=False).lane is not lane  # a replacement's own
