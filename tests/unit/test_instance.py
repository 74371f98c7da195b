"""InstanceRuntime driven through a FakeSeam: spawn, readiness, the stop ladder, restarts.

No processes: the fake seam hands out pids and records asks and signals; the tests play the
runners (channel messages, exits) and move a fake monotonic clock.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from exod.config.schema import (
    BackoffPolicy,
    Instance,
    RestartMode,
    StartLimit,
    StopPolicy,
)
from exod.wire import messages as m
from exod.core.exits import ExitInfo
from exod.core.shards import pipeline_shards
from exod.core.states import State
from exod.daemon.instance import InstanceRuntime
from tests.unit.fakes import ASK, KILL, TERM, FakeSeam, Spawned

T0 = 1000.0
STOP = StopPolicy(grace=10.0, drain=5.0, attempts=3, interval=5.0, kill_interval=1.0)
BACKOFF = BackoffPolicy(initial=2.0, multiplier=2.0, max=30.0, jitter=0.0, reset_after=60.0)
LIMIT = StartLimit(burst=5, interval=60.0)
S = State


def make(seam: FakeSeam, *, ranks: int = 1, layers: int = 4, restart: RestartMode = "on-failure",
         stop: StopPolicy = STOP, backoff: BackoffPolicy = BACKOFF,
         limit: StartLimit = LIMIT) -> InstanceRuntime:
    # Built directly: config validation refuses shards > 1 today, the runtime does not.
    cfg = Instance(name="llama", model=Path("/models/llama"), shards=ranks, restart=restart,
                   stop=stop, backoff=backoff, start_limit=limit)
    return InstanceRuntime(cfg, pipeline_shards(layers, ranks), seam)


def ready(seam: FakeSeam, **kw: Any) -> tuple[InstanceRuntime, list[int]]:
    """An instance started and loaded on every rank, at the current time."""
    inst = make(seam, **kw)
    inst.start()
    pids = seam.pids(inst)
    for pid, rank in zip(pids, inst.ranks, strict=True):
        seam.load(pid, rank.shard.count)
    assert inst.state is S.READY
    return inst, pids


def spy(obj: object, name: str) -> list[tuple[Any, ...]]:
    """Record the calls of obj.name (still calling through)."""
    calls: list[tuple[Any, ...]] = []
    real: Callable[..., Any] = getattr(obj, name)

    def wrapper(*args: Any) -> Any:
        calls.append(args)
        return real(*args)

    setattr(obj, name, wrapper)
    return calls


def transitions(inst: InstanceRuntime) -> list[tuple[str, str]]:
    return [(t.old.value, t.new.value) for t in inst.machine.history]


def dedup(xs: list[str]) -> list[str]:
    return [x for i, x in enumerate(xs) if i == 0 or xs[i - 1] != x]


@pytest.fixture
def seam() -> FakeSeam:
    return FakeSeam(T0)


# ---- start and readiness ---------------------------------------------------------------------
def test_start_spawns_then_progress_then_ready(seam: FakeSeam) -> None:
    inst = make(seam)
    became_ready = spy(inst.tracker, "on_ready")
    inst.start()
    assert inst.state is S.STARTING and inst.started_at == T0
    (sp,) = seam.spawns
    assert sp == Spawned(T0, "llama", 0, sp.pid, "0:4")
    rank = inst.ranks[0]
    assert (rank.pid, rank.state, rank.started_at) == (sp.pid, S.STARTING, T0)

    seam.advance(3)
    seam.send(sp.pid, m.LoadProgress(1, 4))
    assert inst.state is S.LOADING and rank.state is S.LOADING
    assert (rank.layers_loaded, rank.layers_total, rank.last_progress) == (1, 4, T0 + 3)
    assert rank.status_text == "loading 1/4"

    seam.advance(2)
    seam.send(sp.pid, m.LoadProgress(4, 4))
    assert inst.state is S.LOADING and became_ready == []
    seam.send(sp.pid, m.Ready())
    assert inst.state is S.READY and rank.state is S.READY
    assert became_ready == [(T0 + 5,)]
    assert transitions(inst) == [("stopped", "starting"), ("starting", "loading"),
                                 ("loading", "ready")]
    assert inst.machine.since == T0 + 5
    assert dedup([s for _, s in seam.changes]) == ["starting", "loading", "ready"]
    assert seam.actions == [] and seam.pending() == []



def test_each_message_is_published_once(seam: FakeSeam) -> None:
    """Status streams (exoctl wait, watch) and STATUS= get one snapshot per message, taken
    after every change it made: the state move included."""
    inst = make(seam, layers=2)
    inst.start()
    pid = seam.pids(inst)[0]
    for msg, state in ((m.LoadProgress(1, 2), "loading"), (m.LoadProgress(2, 2), "loading"),
                       (m.Ready(), "ready"),
                       (m.Status(m.Phase.SERVING, "serving 1 request(s)", active=1), "ready")):
        before = len(seam.changes)
        seam.send(pid, msg)
        assert [s for _, s in seam.changes[before:]] == [state], msg

def test_ready_without_any_progress(seam: FakeSeam) -> None:
    inst = make(seam)
    inst.start()
    seam.send(seam.pids(inst)[0], m.Ready())
    assert inst.state is S.READY
    assert transitions(inst) == [("stopped", "starting"), ("starting", "ready")]


@pytest.mark.parametrize("msg", [m.Stopping(), m.Heartbeat(),
                                 m.Status(m.Phase.CONNECTING, "connecting", attempt=2)])
def test_messages_that_do_not_move_the_state(seam: FakeSeam, msg: m.FromRunner) -> None:
    inst = make(seam)
    inst.start()
    seam.send(seam.pids(inst)[0], msg)
    assert inst.state is S.STARTING and inst.ranks[0].layers_loaded == 0


def test_status_and_heartbeat_are_recorded(seam: FakeSeam) -> None:
    inst = make(seam)
    inst.start()
    seam.advance(7)
    seam.send(seam.pids(inst)[0], m.Status(m.Phase.STARTING, "warming up"))
    seam.send(seam.pids(inst)[0], m.Heartbeat())
    assert inst.ranks[0].status_text == "warming up"
    assert inst.ranks[0].phase is m.Phase.STARTING
    assert inst.ranks[0].last_heartbeat == T0 + 7


def test_heartbeats_and_repeated_status_publish_nothing(seam: FakeSeam) -> None:
    # A runner flooding its channel with them must not cost a snapshot per watcher per frame.
    inst = make(seam)
    inst.start()
    pid = seam.pids(inst)[0]
    seam.send(pid, m.Status(m.Phase.STARTING, "warming up"))
    before = len(seam.changes)
    for _ in range(100):
        seam.send(pid, m.Heartbeat())
        seam.send(pid, m.Status(m.Phase.STARTING, "warming up"))
    assert len(seam.changes) == before
    seam.send(pid, m.Status(m.Phase.STARTING, "warming up more"))
    assert len(seam.changes) == before + 1


def test_messages_and_exits_of_unknown_pids_are_ignored(seam: FakeSeam) -> None:
    inst = make(seam)
    inst.start()
    inst.on_message(99999, m.Ready())
    inst.on_exit(99999, ExitInfo(code=1))
    assert inst.state is S.STARTING and inst.ranks[0].pid is not None


@pytest.mark.parametrize("load", [False, True])
def test_start_while_active_is_a_no_op(seam: FakeSeam, load: bool) -> None:
    inst = make(seam)
    inst.start()
    if load:
        seam.load(seam.pids(inst)[0])
    inst.start()
    inst.start(operator=True)
    assert len(seam.spawns) == 1


def test_every_local_rank_gets_its_layers(seam: FakeSeam) -> None:
    inst = make(seam, ranks=3, layers=7)
    inst.ranks[1].local = False  # runs on another host
    inst.start()
    assert [(s.rank, s.layers) for s in seam.spawns] == [(0, "0:3"), (2, "5:7")]
    assert inst.ranks[1].pid is None


def test_group_is_ready_only_when_every_rank_is(seam: FakeSeam) -> None:
    inst = make(seam, ranks=3, layers=6)
    became_ready = spy(inst.tracker, "on_ready")
    inst.start()
    assert [(s.rank, s.layers) for s in seam.spawns] == [(0, "0:2"), (1, "2:4"), (2, "4:6")]
    p0, p1, p2 = seam.pids(inst)
    assert len({p0, p1, p2}) == 3
    seam.send(p1, m.LoadProgress(1, 2))
    assert inst.state is S.LOADING
    assert [r.state for r in inst.ranks] == [S.STARTING, S.LOADING, S.STARTING]
    seam.load(p0, 2)
    seam.load(p1, 2)
    assert inst.state is S.LOADING and became_ready == []
    seam.advance(4)
    seam.send(p2, m.Ready())
    assert inst.state is S.READY and became_ready == [(T0 + 4,)]


# ---- the stop ladder -------------------------------------------------------------------------
def test_stop_walks_the_ladder_at_exact_times_until_reaped(seam: FakeSeam) -> None:
    inst, (pid,) = ready(seam)
    done: list[float] = []
    inst.stop(then=lambda: done.append(seam.now()))
    rank = inst.ranks[0]
    assert inst.state is S.STOPPING and rank.state is S.STOPPING
    assert seam.steps(pid) == [(T0, ASK)] and seam.drains == [STOP.drain]

    seam.advance(9.999)
    assert seam.steps(pid) == [(T0, ASK)]
    seam.advance_to(T0 + 27.5)
    ladder = [(T0, ASK), (T0 + 10, TERM), (T0 + 15, TERM), (T0 + 20, TERM),
              (T0 + 25, KILL), (T0 + 26, KILL), (T0 + 27, KILL)]
    assert seam.steps(pid) == ladder
    assert rank.signals_sent == [ASK, TERM, TERM, TERM, KILL, KILL, KILL]
    assert inst.state is S.STOPPING and done == []

    seam.exit(pid, sig=9)
    assert inst.state is S.STOPPED and rank.state is S.STOPPED
    assert (rank.pid, rank.ladder, rank.last_exit) == (None, None, ExitInfo(signal=9))
    assert rank.machine.reason == "signal 9 (SIGKILL) after SIGKILL"
    assert done == [T0 + 27.5]
    assert seam.pending() == []
    seam.advance(100)
    assert seam.steps(pid) == ladder and done == [T0 + 27.5]


LADDER_TIMES = [(0.0, ASK), (10.0, TERM), (15.0, TERM), (20.0, TERM), (25.0, KILL), (26.0, KILL)]


@pytest.mark.parametrize("reaped_after", range(1, len(LADDER_TIMES) + 1))
def test_reaping_stops_the_ladder(seam: FakeSeam, reaped_after: int) -> None:
    inst, (pid,) = ready(seam)
    inst.stop()
    seam.advance(LADDER_TIMES[reaped_after - 1][0] + 0.5)
    seam.exit(pid, sig=15)
    assert inst.state is S.STOPPED and seam.pending() == []
    seam.advance(1000)
    assert seam.steps(pid) == [(T0 + t, step) for t, step in LADDER_TIMES[:reaped_after]]


@pytest.mark.parametrize(("grace", "drain", "sent"), [(10.0, 5.0, 5.0), (4.0, 5.0, 3.0),
                                                      (0.5, 5.0, 0.0)])
def test_the_drain_asked_for_leaves_a_second_of_grace_for_the_exit(
        seam: FakeSeam, grace: float, drain: float, sent: float) -> None:
    stop = StopPolicy(grace=grace, drain=drain, attempts=3, interval=5.0, kill_interval=1.0)
    inst, _ = ready(seam, stop=stop)
    inst.stop()
    assert seam.drains == [sent]
    assert seam.graces == [grace]  # the runner writes its prompt cache until then


def test_a_cooperative_runner_gets_no_signal_at_all(seam: FakeSeam) -> None:
    inst, (pid,) = ready(seam)
    inst.stop()
    seam.advance(1.5)
    seam.send(pid, m.Stopping())
    seam.exit(pid, code=0)
    assert inst.state is S.STOPPED and inst.ranks[0].machine.reason == "exit code 0"
    seam.advance(1000)
    assert seam.actions == [(T0, pid, ASK)]
    assert seam.pending() == []


def test_the_ladder_goes_on_when_the_channel_is_closed(seam: FakeSeam) -> None:
    inst, (pid,) = ready(seam)
    seam.live.discard(pid)  # the ask cannot be delivered
    inst.stop()
    seam.advance(10)
    assert seam.steps(pid) == [(T0, ASK), (T0 + 10, TERM)]


def test_a_second_stop_does_not_restart_the_ladder(seam: FakeSeam) -> None:
    inst, (pid,) = ready(seam)
    done: list[str] = []
    inst.stop(then=lambda: done.append("a"))
    seam.advance(8)
    inst.stop(then=lambda: done.append("b"))
    seam.advance(2)
    assert seam.steps(pid) == [(T0, ASK), (T0 + 10, TERM)]
    seam.exit(pid, code=0)
    assert done == ["a", "b"]


@pytest.mark.parametrize("state", ["stopped", "failed", "backoff"])
def test_stop_without_processes_ends_at_once(seam: FakeSeam, state: str) -> None:
    inst = make(seam, limit=StartLimit(burst=1, interval=60.0))
    if state != "stopped":
        inst.start()
        if state == "backoff":
            inst.tracker.limit = LIMIT
        seam.exit(seam.pids(inst)[0], code=1)
    assert inst.state.value == state
    done: list[float] = []
    inst.stop(then=lambda: done.append(seam.now()))
    assert inst.state is S.STOPPED and done == [T0]
    seam.advance(1000)
    assert inst.state is S.STOPPED and done == [T0] and len(seam.spawns) <= 1


def test_hurry_skips_the_grace_on_every_rank(seam: FakeSeam) -> None:
    inst, pids = ready(seam, ranks=2)
    inst.stop()
    seam.advance(2)
    inst.hurry()
    seam.advance(0)
    seam.advance_to(T0 + 18)
    for pid in pids:
        assert seam.steps(pid) == [(T0, ASK), (T0 + 2, TERM), (T0 + 7, TERM), (T0 + 12, TERM),
                                   (T0 + 17, KILL), (T0 + 18, KILL)]


def test_hurry_after_the_grace_or_outside_a_stop_changes_nothing(seam: FakeSeam) -> None:
    inst, (pid,) = ready(seam)
    inst.hurry()
    seam.advance(100)
    assert seam.actions == []
    t1 = seam.now()
    inst.stop()
    seam.advance(11)
    inst.hurry()
    seam.advance(4)
    assert seam.steps(pid) == [(t1, ASK), (t1 + 10, TERM), (t1 + 15, TERM)]


def test_a_stalled_loop_does_not_push_sigkill_past_the_worst_case(seam: FakeSeam) -> None:
    inst, (pid,) = ready(seam)
    inst.stop()
    seam.stall(20)  # the loop was busy; the SIGTERM due at +10 goes out at +20
    seam.advance(0)
    seam.advance_to(T0 + 25)
    assert (T0 + 25, KILL) in seam.steps(pid)


# ---- unexpected exits and restarts ---------------------------------------------------------------
def test_unexpected_exit_backs_off_then_restarts_at_the_delay(seam: FakeSeam) -> None:
    inst, (pid,) = ready(seam)
    seam.advance(5)
    seam.exit(pid, code=1)
    rank = inst.ranks[0]
    assert inst.state is S.BACKOFF and inst.machine.reason == "restart in 2.0s"
    assert rank.state is S.FAILED and rank.pid is None and rank.last_exit == ExitInfo(code=1)
    assert inst.tracker.restarts == 1 and seam.pending() == [T0 + 7]

    seam.advance(1.999)
    assert inst.state is S.BACKOFF and len(seam.spawns) == 1
    seam.advance(0.001)
    assert inst.state is S.STARTING and rank.state is S.STARTING
    assert len(seam.spawns) == 2 and seam.spawns[1].at == T0 + 7
    new = seam.spawns[1].pid
    assert new != pid and rank.pid == new and rank.signals_sent == [] and rank.error == ""

    seam.exit(new, sig=9)  # again, before it was ever ready: the delay grows
    assert inst.state is S.BACKOFF and inst.machine.reason == "restart in 4.0s"
    assert inst.tracker.restarts == 2 and seam.pending() == [T0 + 11]
    assert seam.actions == []


@pytest.mark.parametrize(("ran_for", "delay"), [(59.0, "8.0"), (60.0, "2.0")])
def test_a_stable_run_resets_the_backoff(seam: FakeSeam, ran_for: float, delay: str) -> None:
    inst, (pid,) = ready(seam)
    for _ in range(2):  # two quick failures: delays 2, 4
        seam.exit(pid, code=1)
        seam.advance(10)
        (pid,) = seam.pids(inst)
    seam.load(pid)
    seam.advance(ran_for)
    seam.exit(pid, code=1)
    assert inst.machine.reason == f"restart in {delay}s"


def test_a_permanent_exit_fails_at_once_with_the_runners_reason(seam: FakeSeam) -> None:
    inst = make(seam)
    inst.start()
    (pid,) = seam.pids(inst)
    seam.send(pid, m.LoadProgress(2, 4))
    seam.send(pid, m.Failed("cannot load model: missing model.safetensors", 65))
    seam.exit(pid, code=65)
    rank = inst.ranks[0]
    assert inst.state is S.FAILED
    assert inst.machine.reason == "exit code 65: cannot load model: missing model.safetensors"
    assert rank.state is S.FAILED and rank.error == "cannot load model: missing model.safetensors"
    assert rank.machine.reason == rank.error
    assert seam.pending() == [] and inst.tracker.restarts == 0
    seam.advance(3600)
    assert inst.state is S.FAILED and len(seam.spawns) == 1


def test_start_limit_fails_until_an_operator_starts_it(seam: FakeSeam) -> None:
    inst = make(seam, backoff=BackoffPolicy(initial=1.0, jitter=0.0),
                limit=StartLimit(burst=3, interval=60.0))
    inst.start()
    for delay in (1.0, 2.0):
        seam.advance(0.5)
        seam.exit(seam.pids(inst)[0], code=1)
        assert inst.state is S.BACKOFF
        seam.advance(delay)
        assert inst.state is S.STARTING
    seam.advance(0.5)
    seam.exit(seam.pids(inst)[0], code=1)
    assert inst.state is S.FAILED and "start limit" in inst.machine.reason
    assert seam.pending() == []
    seam.advance(10_000)
    assert inst.state is S.FAILED and len(seam.spawns) == 3

    inst.start(operator=True)
    assert inst.state is S.STARTING and inst.machine.reason == "started by operator"
    assert len(seam.spawns) == 4
    seam.exit(seam.pids(inst)[0], code=1)
    assert inst.state is S.BACKOFF and inst.machine.reason == "restart in 1.0s"


@pytest.mark.parametrize(("mode", "code", "sig", "state"), [
    ("no", 1, None, S.FAILED),
    ("no", 0, None, S.STOPPED),
    ("no", None, 9, S.FAILED),
    ("on-failure", 0, None, S.STOPPED),
    ("on-failure", None, 11, S.BACKOFF),
    ("always", 0, None, S.BACKOFF),
])
def test_restart_modes(seam: FakeSeam, mode: RestartMode, code: int | None, sig: int | None,
                       state: State) -> None:
    inst, (pid,) = ready(seam, restart=mode)
    seam.exit(pid, code=code, sig=sig)
    assert inst.state is state
    assert seam.pending() == ([T0 + 2] if state is S.BACKOFF else [])


def test_stop_during_backoff_cancels_the_restart(seam: FakeSeam) -> None:
    inst, (pid,) = ready(seam)
    seam.exit(pid, code=1)
    assert inst.state is S.BACKOFF
    inst.stop(operator=True)
    assert inst.state is S.STOPPED and inst.held
    assert inst.machine.reason == "stopped by operator"
    assert seam.pending() == []
    seam.advance(100)
    assert inst.state is S.STOPPED and len(seam.spawns) == 1


def test_restart_from_ready(seam: FakeSeam) -> None:
    inst, (pid,) = ready(seam)
    inst.restart()
    assert inst.state is S.STOPPING and seam.steps(pid) == [(T0, ASK)]
    seam.advance(1)
    seam.exit(pid, code=0)
    assert inst.state is S.STARTING and inst.machine.reason == "started by operator"
    assert len(seam.spawns) == 2 and seam.spawns[1].at == T0 + 1
    assert transitions(inst)[-3:] == [("ready", "stopping"), ("stopping", "stopped"),
                                      ("stopped", "starting")]


@pytest.mark.parametrize("from_failed", [False, True])
def test_restart_without_processes_starts_at_once(seam: FakeSeam, from_failed: bool) -> None:
    inst = make(seam, restart="no")
    if from_failed:
        inst.start()
        seam.exit(seam.pids(inst)[0], code=1)
        assert inst.state is S.FAILED
    inst.restart()
    assert inst.state is S.STARTING and inst.ranks[0].pid == seam.spawns[-1].pid


def test_start_during_stopping_waits_for_the_stop(seam: FakeSeam) -> None:
    inst, (pid,) = ready(seam)
    inst.stop(operator=True)
    inst.start(operator=True)
    assert inst.state is S.STOPPING and len(seam.spawns) == 1 and not inst.held
    seam.advance(2)
    seam.exit(pid, code=0)
    assert inst.state is S.STARTING and len(seam.spawns) == 2 and seam.spawns[1].at == T0 + 2
    assert transitions(inst)[-2:] == [("stopping", "stopped"), ("stopped", "starting")]
    # the deferred start ran once: a later stop stays stopped
    (new,) = seam.pids(inst)
    inst.stop()
    seam.exit(new, code=0)
    assert inst.state is S.STOPPED and len(seam.spawns) == 2


def test_an_operator_stop_cancels_a_deferred_start(seam: FakeSeam) -> None:
    inst, (pid,) = ready(seam)
    inst.stop(operator=True)
    inst.start(operator=True)
    inst.stop(operator=True)
    seam.exit(pid, code=0)
    assert inst.state is S.STOPPED and inst.held and len(seam.spawns) == 1


def test_any_stop_cancels_a_deferred_start(seam: FakeSeam) -> None:
    inst, (pid,) = ready(seam)
    inst.stop(operator=True)  # exoctl stop
    inst.start(operator=True)  # exoctl start, while the ladder runs: deferred
    inst.stop()  # exod itself is stopping (SIGTERM → begin_shutdown)
    seam.exit(pid, code=0)
    assert inst.state is S.STOPPED and len(seam.spawns) == 1



def test_a_retired_instance_never_starts_again(seam: FakeSeam) -> None:
    """A reload swapped it for a replacement when its stop completed: a start deferred past
    that point (exoctl start during the stop) is the replacement's, not this runtime's."""
    inst, (pid,) = ready(seam)
    inst.retire(replacement=None)  # what a reload does
    inst.start(operator=True)  # deferred until the stop completes
    seam.exit(pid, code=0)
    assert inst.state is S.STOPPED and len(seam.spawns) == 1
    assert [(name, then.replacement) for _, name, then in seam.retirements] == [("llama", None)]
    inst.start(operator=True)
    assert inst.state is S.STOPPED and len(seam.spawns) == 1


# ---- groups ----------------------------------------------------------------------------------
def test_a_dead_rank_stops_its_siblings_politely_then_the_group_restarts(seam: FakeSeam) -> None:
    inst, (p0, p1, p2) = ready(seam, ranks=3, layers=6)
    seam.advance(5)
    seam.exit(p1, code=1)
    assert inst.state is S.STOPPING and inst.machine.reason == "rank 1 exit code 1"
    assert [r.state for r in inst.ranks] == [S.STOPPING, S.FAILED, S.STOPPING]
    assert seam.steps(p0) == seam.steps(p2) == [(T0 + 5, ASK)]
    assert seam.steps(p1) == []
    assert seam.pending() == [T0 + 15, T0 + 15]  # the siblings' ladders, nothing else

    seam.advance(2)
    seam.exit(p0, code=0)
    assert inst.state is S.STOPPING
    seam.exit(p2, code=0)
    assert inst.state is S.BACKOFF and inst.machine.reason == "restart in 2.0s"
    assert [r.state for r in inst.ranks] == [S.STOPPED, S.FAILED, S.STOPPED]
    assert seam.signals() == []  # no sibling was ever signalled
    assert seam.pending() == [T0 + 9] and inst.tracker.restarts == 1

    seam.advance(2)
    assert inst.state is S.STARTING and len(seam.spawns) == 6
    assert [s.rank for s in seam.spawns[3:]] == [0, 1, 2]
    assert all(r.state is S.STARTING and r.layers_loaded == 0 for r in inst.ranks)


def test_a_sibling_that_ignores_the_ask_gets_the_ladder(seam: FakeSeam) -> None:
    inst, (p0, p1, p2) = ready(seam, ranks=3, layers=3)
    seam.exit(p0, sig=9)
    seam.advance(1)
    seam.exit(p1, code=0)  # cooperative
    seam.advance_to(T0 + 12)
    seam.exit(p2, sig=15)  # needed one SIGTERM
    assert inst.state is S.BACKOFF
    assert seam.steps(p1) == [(T0, ASK)]
    assert seam.steps(p2) == [(T0, ASK), (T0 + 10, TERM)]
    seam.advance(1.999)  # the restart is due 2s after the last rank is gone
    assert inst.state is S.BACKOFF
    seam.advance(0.001)
    assert inst.state is S.STARTING


def test_a_stubborn_sibling_is_killed_then_the_group_fails(seam: FakeSeam) -> None:
    inst, (p0, p1) = ready(seam, ranks=2, restart="no")
    seam.exit(p0, code=3)
    seam.advance_to(T0 + 25)
    assert seam.steps(p1) == [(T0, ASK), (T0 + 10, TERM), (T0 + 15, TERM), (T0 + 20, TERM),
                              (T0 + 25, KILL)]
    seam.exit(p1, sig=9)
    assert inst.state is S.FAILED and inst.machine.reason == "exit code 3"
    assert seam.pending() == []


def test_a_permanent_failure_in_a_group_fails_it_after_the_siblings_stop(seam: FakeSeam) -> None:
    inst = make(seam, ranks=2)
    inst.start()
    p0, p1 = seam.pids(inst)
    seam.send(p1, m.Failed("layers 2:4: shape mismatch", 65))
    seam.exit(p1, code=65)
    assert inst.state is S.STOPPING and seam.steps(p0) == [(T0, ASK)]
    seam.exit(p0, code=0)
    assert inst.state is S.FAILED
    assert inst.machine.reason == "exit code 65: layers 2:4: shape mismatch"
    assert seam.pending() == [] and inst.tracker.restarts == 0


def test_operator_stop_during_a_group_stop_cancels_the_pending_restart(seam: FakeSeam) -> None:
    inst, (p0, p1) = ready(seam, ranks=2)
    seam.exit(p0, code=1)
    assert inst.state is S.STOPPING
    inst.stop(operator=True)
    assert seam.steps(p1) == [(T0, ASK)]  # the ladder already running is not restarted
    seam.exit(p1, code=0)
    assert inst.state is S.STOPPED and seam.pending() == []
    seam.advance(100)
    assert len(seam.spawns) == 2


def test_group_stop_ends_when_the_last_rank_is_gone(seam: FakeSeam) -> None:
    inst, pids = ready(seam, ranks=3, layers=3)
    done: list[float] = []
    inst.stop(then=lambda: done.append(seam.now()))
    assert all(seam.steps(p) == [(T0, ASK)] for p in pids)
    for pid in pids:
        assert inst.state is S.STOPPING and done == []
        seam.advance(1)
        seam.exit(pid, code=0)
    assert inst.state is S.STOPPED and done == [T0 + 3]


# ---- spawn failures --------------------------------------------------------------------------
def test_spawn_error_fails_without_crashing(seam: FakeSeam) -> None:
    inst = make(seam)
    seam.spawn_errors[0] = FileNotFoundError(2, "No such file or directory", "python3")
    inst.start()
    rank = inst.ranks[0]
    assert inst.state is S.FAILED and "cannot start runner" in inst.machine.reason
    assert rank.pid is None and rank.state is S.FAILED
    assert rank.error.startswith("cannot start runner: ") and "No such file" in rank.error
    assert rank.last_exit == ExitInfo(code=69)
    assert seam.pending() == []
    del seam.spawn_errors[0]
    inst.start(operator=True)
    assert inst.state is S.STARTING and rank.error == ""


def test_spawn_error_in_a_group_stops_the_ranks_that_started(seam: FakeSeam) -> None:
    inst = make(seam, ranks=3, layers=3)
    seam.spawn_errors[1] = PermissionError(13, "Permission denied")
    inst.start()
    p0, p2 = inst.ranks[0].pid, inst.ranks[2].pid
    assert p0 is not None and p2 is not None and inst.ranks[1].pid is None
    assert inst.state is S.STOPPING
    assert seam.steps(p0) == seam.steps(p2) == [(T0, ASK)]
    seam.exit(p0, code=0)
    seam.exit(p2, code=0)
    assert inst.state is S.FAILED and "cannot start runner" in inst.machine.reason



def test_spawn_errors_on_every_rank_are_one_failure(seam: FakeSeam) -> None:
    inst = make(seam, ranks=2, layers=2)
    seam.spawn_errors[0] = seam.spawn_errors[1] = BlockingIOError(11, "Resource unavailable")
    inst.start()
    assert inst.state is S.BACKOFF and inst.tracker.restarts == 1
    assert seam.pending() == [T0 + BACKOFF.initial]
    assert all(r.state is S.FAILED and r.last_exit == ExitInfo(code=75) for r in inst.ranks)


def test_a_host_out_of_fds_backs_off_but_never_hits_the_start_limit(seam: FakeSeam) -> None:
    """EMFILE/ENFILE (e.g. a flood of connections took every fd) is the host's shortage, not
    the runner's failure: retried with backoff, never counted toward the start limit."""
    inst = make(seam)
    seam.spawn_errors[0] = OSError(errno.EMFILE, "Too many open files")
    inst.start()
    for _ in range(LIMIT.burst * 3):
        assert inst.state is S.BACKOFF, inst.machine.reason
        seam.advance_to(seam.pending()[0])
    assert inst.tracker.restarts == LIMIT.burst * 3 + 1
    del seam.spawn_errors[0]
    seam.advance_to(seam.pending()[0])
    assert inst.state is S.STARTING  # the fds came back: it starts as usual


def test_a_permanent_spawn_error_then_a_temporary_one_fails_the_group(seam: FakeSeam) -> None:
    inst = make(seam, ranks=2, layers=2)
    seam.spawn_errors[0] = FileNotFoundError(2, "No such file or directory")
    seam.spawn_errors[1] = BlockingIOError(11, "Resource unavailable")
    inst.start()
    assert inst.state is S.FAILED and seam.pending() == []


def test_remote_ranks_follow_the_local_group(seam: FakeSeam) -> None:
    """Rank 1 runs on another host: this daemon spawns rank 0 only, and learns of rank 1 from
    rank 0, whose READY comes after a barrier across the whole group."""
    inst = make(seam, ranks=2)
    inst.ranks[1].local, inst.ranks[1].host = False, "other"
    inst.start()
    assert [s.rank for s in seam.spawns] == [0]
    assert seam.prepared == [(seam.clock, inst.name)]
    assert inst.ranks[1].state is S.STARTING and inst.ranks[1].pid is None
    pid = inst.ranks[0].pid
    assert pid is not None
    seam.send(pid, m.LoadProgress(1, 2))
    seam.send(pid, m.Ready())
    assert inst.state is S.READY and inst.ranks[1].state is S.READY
    seam.exit(pid, code=76)  # the group broke: peer lost
    assert inst.state is S.BACKOFF and inst.ranks[1].state is S.STOPPED


def test_an_instance_with_no_rank_here_is_not_started(seam: FakeSeam) -> None:
    inst = make(seam, ranks=2)
    for r in inst.ranks:
        r.local = False
    inst.start()
    assert inst.state is S.STOPPED and seam.spawns == []


def test_blas_threads_are_split_among_the_local_ranks_of_a_group() -> None:
    import os

    from exod.daemon.rank_addresses import thread_split

    cores = len(os.sched_getaffinity(0))
    two = Instance(name="g", model=Path("/m"), shards=2)
    assert thread_split(two, 2, {}) == max(1, cores // 2)  # OPENBLAS_NUM_THREADS, in the spec
    assert thread_split(two, 1, {}) is None  # the other rank runs on another host
    assert thread_split(two, 2, {"OPENBLAS_NUM_THREADS": "3"}) is None  # the operator decides
    mine = Instance(name="g", model=Path("/m"), shards=2, env={"OPENBLAS_NUM_THREADS": "2"})
    assert thread_split(mine, 2, {}) is None
    assert thread_split(Instance(name="s", model=Path("/m")), 1, {}) is None


def test_status_says_when_a_stop_would_turn_to_sigkill(seam: FakeSeam) -> None:
    from exod.wire.control_status import LadderStatus
    from exod.daemon.status import detail, rank_status

    inst, (pid,) = ready(seam)
    inst.stop()
    assert detail(inst, seam.clock, 60) == "stopping (SIGKILL in 25s if still running)"
    seam.advance(12)  # grace over, one SIGTERM sent
    assert detail(inst, seam.clock, 60) == "stopping (SIGKILL in 13s if still running)"
    assert rank_status(inst.ranks[0], seam.clock, 60).ladder == LadderStatus("SIGTERM", 13.0)
    seam.advance(13)
    assert detail(inst, seam.clock, 60) == "stopping (SIGKILL being sent)"
    seam.exit(pid, sig=9)
    assert detail(inst, seam.clock, 60) == "stopped"


# ---- hangs and memory admission ---------------------------------------------------------------
def test_a_hang_restarts_through_the_ladder_and_counts(seam: FakeSeam) -> None:
    inst, (pid,) = ready(seam)
    inst.hang(300.0)
    assert inst.state is S.STOPPING and inst.hung == "hung (no progress for 5m)"
    assert seam.steps(pid) == [(T0, ASK)]  # the ladder, from rung 1
    seam.advance(STOP.grace)
    assert seam.steps(pid)[-1] == (T0 + STOP.grace, TERM)
    seam.exit(pid, sig=15)
    assert inst.state is S.BACKOFF and inst.tracker.restarts == 1
    assert inst.machine.reason.startswith("restart in")
    seam.advance(BACKOFF.initial)
    assert inst.state is S.STARTING and inst.hung == ""  # a new run is not hung


def test_a_hang_counts_against_the_start_limit(seam: FakeSeam) -> None:
    inst, _ = ready(seam, limit=StartLimit(burst=1, interval=60.0))
    inst.hang(10.0)
    (pid,) = [p for p in seam.live]
    seam.exit(pid, code=0)
    assert inst.state is S.FAILED and "hung" in inst.machine.reason
    assert "start limit hit" in inst.machine.reason


def test_hang_is_ignored_unless_ready(seam: FakeSeam) -> None:
    inst = make(seam)
    inst.start()
    inst.hang(999.0)  # a late report about a load: loading is never timed
    assert inst.state is S.STARTING and inst.hung == ""


def test_memory_refusal_fails_before_any_runner(seam: FakeSeam) -> None:
    seam.refusal = "not enough memory: needs 64.0 GiB, 21.3 GiB available"
    inst = make(seam)
    inst.start()
    assert inst.state is S.FAILED and inst.machine.reason == seam.refusal
    assert seam.spawns == [] and inst.tracker.restarts == 0 and inst.refused == seam.refusal
    seam.refusal = None  # memory came free: a new start goes ahead
    inst.start(operator=True)
    assert inst.state is S.STARTING and inst.refused == "" and len(seam.spawns) == 1


def test_group_that_cannot_be_prepared_fails_before_any_runner(seam: FakeSeam) -> None:
    seam.prepare_error = OSError(28, "No space left on device")
    inst = make(seam)
    inst.start()
    assert inst.state is S.FAILED and "cannot prepare the group" in inst.machine.reason
    assert "No space left" in inst.machine.reason and seam.spawns == []
    seam.prepare_error = None
    inst.start(operator=True)
    assert inst.state is S.STARTING and len(seam.spawns) == 1


def test_a_group_without_free_ports_fails_with_the_reason(seam: FakeSeam) -> None:
    from exod.core.ports import NoFreePorts

    seam.prepare_error = NoFreePorts("found 1 of the 3 free ports needed in 20000-32767 after "
                                     "192 tries")
    inst = make(seam, ranks=2)
    inst.start()
    assert inst.state is S.FAILED and seam.spawns == []
    assert inst.machine.reason == ("cannot prepare the group: found 1 of the 3 free ports "
                                   "needed in 20000-32767 after 192 tries")


# ---- a group on this host alone that does not form ---------------------------------------------
def joining(seam: FakeSeam, **kw: Any) -> tuple[InstanceRuntime, list[int]]:
    inst = make(seam, ranks=2, **kw)
    inst.start()
    pids = seam.pids(inst)
    for pid in pids:
        seam.send(pid, m.Status(m.Phase.CONNECTING, "connecting to 1 peer", attempt=1))
    return inst, pids


def test_a_local_group_that_does_not_form_is_restarted_and_counted(seam: FakeSeam) -> None:
    """Every rank runs here and is joining, yet no group after peer_timeout (60s by default;
    never less than 30s): something holds its ports, and waiting will not help."""
    inst, pids = joining(seam)
    for pid in pids:  # MLX's own retries: a new attempt does not re-arm the bound
        seam.advance(20)
        seam.send(pid, m.Status(m.Phase.CONNECTING, "connecting to 1 peer", attempt=2))
    assert inst.state is S.STARTING
    seam.advance(20)  # 60s after every rank was joining
    assert inst.state is S.STOPPING and inst.hung.startswith(
        "hung connecting: the group did not form within 1m")
    assert "ports held by another program" in inst.hung
    for pid in pids:
        seam.exit(pid, sig=15)
    assert inst.state is S.BACKOFF and inst.tracker.restarts == 1
    from exod.daemon.status import detail

    assert detail(inst, seam.clock, 60).startswith(
        "hung connecting: the group did not form within 1m although all its ranks run on this "
        "host (ports held by another program?); backoff")
    seam.advance(BACKOFF.initial)
    assert inst.state is S.STARTING and inst.hung == "" and len(seam.prepared) == 2


def test_a_group_that_forms_or_spans_hosts_is_never_bounded(seam: FakeSeam) -> None:
    inst, pids = joining(seam)
    seam.send(pids[0], m.LoadProgress(0, 2))  # rank 0 is past joining: the group formed
    seam.advance(3600)
    assert inst.state is S.LOADING and inst.hung == ""

    remote = make(seam, ranks=2)
    remote.ranks[1].local, remote.ranks[1].host = False, "other"
    remote.start()
    pid = remote.ranks[0].pid
    assert pid is not None
    seam.send(pid, m.Status(m.Phase.CONNECTING, "connecting to 1 peer", attempt=1))
    seam.advance(24 * 3600)  # a peer host may be down for hours
    assert remote.state is S.STARTING and remote.hung == ""


def rejoin(seam: FakeSeam, inst: InstanceRuntime, pids: list[int]) -> None:
    """Stop a joining group, let its ranks exit, start it again and have every new rank join."""
    inst.stop()
    for pid in pids:
        seam.exit(pid, code=0)
    inst.start(operator=True)
    for pid in seam.pids(inst):
        seam.send(pid, m.Status(m.Phase.CONNECTING, "connecting to 1 peer", attempt=1))


def test_the_bound_is_for_one_run_only(seam: FakeSeam) -> None:
    """A stop and a start while joining: the old run's bound does not cut the new one short."""
    inst, pids = joining(seam)
    seam.advance(25)
    rejoin(seam, inst, pids)
    seam.advance(59)  # the old run's bound would have fired 35s ago
    assert inst.state is S.STARTING and inst.hung == ""
    seam.advance(1)
    assert inst.state is S.STOPPING


def test_a_short_peer_timeout_still_leaves_mlx_its_own_retries(seam: FakeSeam) -> None:
    import dataclasses

    inst, pids = joining(seam)
    inst.config = dataclasses.replace(inst.config, peer_timeout=1.0)
    rejoin(seam, inst, pids)
    seam.advance(29)
    assert inst.state is S.STARTING
    seam.advance(1)
    assert inst.state is S.STOPPING and "within 30s" in inst.hung
