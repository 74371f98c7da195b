"""Test doubles for the pure parts: an `InstanceSeam` with a fake monotonic clock and recorded
actions, and `FakeDaemon`, which adds what requests need of the daemon (exod.daemon.traffic).

`FakeSeam` is what the supervisor is to an `InstanceRuntime`, minus every OS call: `spawn`
hands out pids, `ask`/`kill` are recorded, timers sit in a heap that `advance(dt)` fires in
time order (the clock jumps to each timer's time before it runs). Tests play the runners'
part with `send(pid, message)` (typed channel messages) and `exit(pid)`.
"""

from __future__ import annotations

import heapq
import itertools
import signal
from collections.abc import Callable
from dataclasses import dataclass, field

from pathlib import Path

from exod.config.schema import BackoffPolicy, StopPolicy
from exod.core.exits import ExitInfo
from exod.core.intents import Retire
from exod.core.names import Names
from exod.daemon.downloads import Download, Downloads
from exod.daemon.instance import InstanceRuntime
from exod.daemon.instance_seam import Continuation
from exod.daemon.rank import RankRuntime
from exod.daemon.traffic import Traffic
from exod.wire import messages as m

ASK = "ask"
TERM = "SIGTERM"
KILL = "SIGKILL"
_SIGNAL_NAMES = {int(signal.SIGTERM): TERM, int(signal.SIGKILL): KILL}


@dataclass(order=True)
class FakeTimer:
    when: float
    seq: int
    fn: Callable[[], None] = field(compare=False)
    cancelled: bool = field(default=False, compare=False)

    def cancel(self) -> None:
        self.cancelled = True


@dataclass(frozen=True)
class Spawned:
    at: float
    instance: str
    rank: int
    pid: int
    layers: str  # the shard's `start:end`


class FakeSeam:
    """InstanceSeam and DownloadSeam: fake clock, timer heap, records of spawns, asks, signals."""

    def __init__(self, start: float = 1000.0) -> None:
        self.clock = start
        self._heap: list[FakeTimer] = []
        self._seq = itertools.count()
        self._pids = itertools.count(4001)
        self.owner: dict[int, InstanceRuntime] = {}  # pid -> instance, for notify/exit delivery
        self.live: set[int] = set()
        self.spawns: list[Spawned] = []
        self.actions: list[tuple[float, int, str]] = []  # (time, pid, ask|SIGTERM|SIGKILL)
        self.drains: list[float] = []  # the `drain` passed with every ask
        self.graces: list[float] = []  # the `grace` passed with every ask
        self.changes: list[tuple[float, str]] = []  # (time, instance state) at every `changed`
        self.spawn_errors: dict[int, OSError] = {}  # rank -> error raised by spawn
        self.prepared: list[tuple[float, str]] = []  # (time, instance) of each group start
        self.refusal: str | None = None  # what memory admission answers
        self.prepare_error: Exception | None = None  # raised by prepare (hostfile not writable)
        # Hub models: what the cache holds (repo -> snapshot), and the fetchers spawned.
        self.cache: dict[str, Path] = {}
        self.fetchers: list[tuple[float, int, str]] = []  # (time, pid, repo)
        self.downloads = Downloads(self, stall_after=60.0, stop=StopPolicy(
            grace=10.0, drain=0.0, attempts=2, interval=5.0, kill_interval=1.0),
            backoff=BackoffPolicy(initial=2.0, multiplier=2.0, max=30.0, jitter=0.0))
        self.download_changes = 0
        self.retirements: list[tuple[float, str, Retire]] = []  # (time, instance, intent)

    # ---- the InstanceSeam protocol ------------------------------------------------------------
    def now(self) -> float:
        return self.clock

    def call_at(self, when: float, fn: Callable[[], None]) -> FakeTimer:
        timer = FakeTimer(when, next(self._seq), fn)
        heapq.heappush(self._heap, timer)
        return timer

    def admit(self, inst: InstanceRuntime) -> str | None:
        return self.refusal

    def prepare(self, inst: InstanceRuntime) -> None:
        if self.prepare_error is not None:
            raise self.prepare_error
        self.prepared.append((self.clock, inst.name))

    def spawn(self, inst: InstanceRuntime, rank: RankRuntime) -> int:
        err = self.spawn_errors.get(rank.rank)
        if err is not None:
            raise err
        pid = next(self._pids)
        self.owner[pid] = inst
        self.live.add(pid)
        self.spawns.append(Spawned(self.clock, inst.name, rank.rank, pid, rank.shard.arg()))
        return pid

    def ask(self, pid: int, drain: float, grace: float = 0.0) -> bool:
        self.actions.append((self.clock, pid, ASK))
        self.drains.append(drain)
        self.graces.append(grace)
        return pid in self.live

    def kill(self, pid: int, sig: int) -> bool:
        self.actions.append((self.clock, pid, _SIGNAL_NAMES.get(int(sig), f"signal {sig}")))
        return pid in self.live

    def link(self, pid: int) -> None:
        return None

    def changed(self, inst: InstanceRuntime) -> None:
        self.changes.append((self.clock, inst.state.value))

    def cached(self, inst: InstanceRuntime) -> bool:
        assert inst.config.hub is not None
        path = self.cache.get(inst.config.hub.repo)
        if path is not None:
            self.use_model(inst, path)
        return path is not None

    def fetch(self, inst: InstanceRuntime) -> Download:
        assert inst.config.hub is not None
        return self.downloads.want(inst.config.hub, inst, inst.fetched)

    def unfetch(self, inst: InstanceRuntime, then: Continuation) -> None:
        self.downloads.leave(inst, then)

    def use_model(self, inst: InstanceRuntime, path: Path) -> None:
        inst.use_model(path, [r.shard for r in inst.ranks], "this-host")  # the same shards

    def retired(self, inst: InstanceRuntime, then: Retire) -> None:
        self.retirements.append((self.clock, inst.name, then))

    def spawn_fetcher(self, d: Download) -> int:
        pid = next(self._pids)
        self.live.add(pid)
        self.fetchers.append((self.clock, pid, d.ref.repo))
        return pid

    def download_changed(self, d: Download) -> None:
        self.download_changes += 1

    # ---- the clock ----------------------------------------------------------------------------
    def advance(self, dt: float) -> None:
        """Move the clock by dt, firing every due timer in (time, scheduling) order."""
        assert dt >= 0
        target = self.clock + dt
        for _ in range(100_000):  # a guard against a timer that keeps rescheduling itself
            while self._heap and self._heap[0].cancelled:
                heapq.heappop(self._heap)
            if not self._heap or self._heap[0].when > target:
                break
            timer = heapq.heappop(self._heap)
            self.clock = max(self.clock, timer.when)
            timer.fn()
        else:
            raise AssertionError("timers keep firing without the clock moving on")
        self.clock = target

    def advance_to(self, when: float) -> None:
        self.advance(max(0.0, when - self.clock))

    def stall(self, dt: float) -> None:
        """A busy event loop: time passes and no timer fires (call `advance(0)` to catch up)."""
        self.clock += dt

    def pending(self) -> list[float]:
        """Times of the timers still armed."""
        return sorted(t.when for t in self._heap if not t.cancelled)

    # ---- playing the runners --------------------------------------------------------------------
    def send(self, pid: int, msg: m.FromRunner) -> None:
        """A message from the runner's (or a fetcher's) channel."""
        if pid in self.downloads.by_pid:
            self.downloads.on_message(pid, msg)
            return
        self.owner[pid].on_message(pid, msg)

    def load(self, pid: int, layers: int = 4) -> None:
        """A well-behaved runner: progress for every layer, then ready."""
        for n in range(1, layers + 1):
            self.send(pid, m.LoadProgress(n, layers))
        self.send(pid, m.Ready())

    def exit(self, pid: int, code: int | None = None, sig: int | None = None) -> None:
        """The process is reaped: deliver its exit to its instance."""
        assert (code is None) != (sig is None), "exactly one of code and sig"
        self.live.discard(pid)
        if pid in self.downloads.by_pid:
            self.downloads.on_exit(pid, ExitInfo(code=code, signal=sig))
            return
        self.owner[pid].on_exit(pid, ExitInfo(code=code, signal=sig))

    # ---- queries --------------------------------------------------------------------------------
    def steps(self, pid: int) -> list[tuple[float, str]]:
        """(time, step) of every ask/signal sent to pid."""
        return [(t, what) for t, p, what in self.actions if p == pid]

    def signals(self, pid: int | None = None) -> list[tuple[float, int, str]]:
        return [a for a in self.actions if a[2] != ASK and (pid is None or a[1] == pid)]

    def pids(self, inst: InstanceRuntime) -> list[int]:
        """Live pids of the instance's ranks, in rank order (asserts each rank has one)."""
        out = []
        for r in inst.ranks:
            assert r.pid is not None, f"rank {r.rank} has no process"
            out.append(r.pid)
        return out


@dataclass(frozen=True)
class FakeLink:
    """Stands for a live runner's channel (requests themselves are not sent in unit tests)."""

    pid: int


class FakeDaemon(FakeSeam):
    """A FakeSeam that is also what the supervisor is to requests: instances by name, change
    listeners (published as `Supervisor._publish` does: traffic first), memory that admission
    finds missing, and its `Traffic`, all on the fake clock."""

    def __init__(self, start: float = 1000.0) -> None:
        super().__init__(start)
        self.instances: dict[str, InstanceRuntime] = {}
        self.stopping = False
        self.missing: dict[str, int] = {}  # instance -> bytes memory admission lacks for it
        self._listeners: list[Callable[[InstanceRuntime], None]] = []
        self.traffic = Traffic(self)

    def add(self, inst: InstanceRuntime) -> InstanceRuntime:
        self.instances[inst.name] = inst
        return inst

    def instance(self, name: str) -> InstanceRuntime | None:
        return self.instances.get(name)

    def serving(self, name: str) -> InstanceRuntime | None:
        target = Names({n: i.config.aliases for n, i in self.instances.items()}).instance(name)
        return self.instances.get(target) if target is not None else None

    def ordered(self) -> list[InstanceRuntime]:
        return sorted(self.instances.values(), key=lambda i: i.name)

    def missing_memory(self, inst: InstanceRuntime) -> int:
        return self.missing.get(inst.name, 0)

    def listen(self, fn: Callable[[InstanceRuntime], None]) -> Callable[[], None]:
        self._listeners.append(fn)
        return lambda: self._listeners.remove(fn)

    def link(self, pid: int) -> FakeLink | None:  # type: ignore[override]
        return FakeLink(pid) if pid in self.live else None

    def changed(self, inst: InstanceRuntime) -> None:
        super().changed(inst)
        self.traffic.changed(inst)
        for fn in list(self._listeners):
            fn(inst)
