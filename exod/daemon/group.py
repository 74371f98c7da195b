"""An instance's ranks as a group: what their runners' reports and exits mean for the instance,
the bound on a local group forming, and stopping them all through the ladder.

A base class of `InstanceRuntime` (exod.daemon.instance), which owns the state machine and what
follows a stop: the hooks at the end of this class are its. Events come in from the process
table (`on_message` from a runner's channel, `on_broken`, `on_exit`); nothing here blocks, and
the OS is reached only through the seam.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING

from exod.wire import messages as m
from exod.config.schema import Instance
from exod.core.exits import EXIT_PROTOCOL, ExitInfo, Hung
from exod.core.restarts import Decision, RestartTracker
from exod.core.shards import Shard
from exod.core.states import Machine, State
from exod.daemon import forming
from exod.daemon.forming import FormingWatch
from exod.daemon.rank import RankRuntime, RankSeam

if TYPE_CHECKING:
    from loguru import Logger

    from exod.daemon.channel import RunnerChannel


class RankGroup:
    config: Instance
    machine: Machine
    tracker: RestartTracker
    log: Logger
    hung: str  # e.g. "hung (no progress for 5m)": why it is being restarted

    def __init__(self, shards: list[Shard], seam: RankSeam) -> None:
        self.seam = seam
        self.ranks = [RankRuntime(shard=s, layers_total=s.count) for s in shards]
        self.forming = FormingWatch(seam)  # a group on this host alone must form in time
        self.rungs_used: collections.Counter[str] = collections.Counter()  # ladder steps taken

    # ---- queries ----------------------------------------------------------------------------
    @property
    def state(self) -> State:
        return self.machine.state

    def alive(self) -> list[RankRuntime]:
        return [r for r in self.ranks if r.pid is not None]

    @property
    def has_local_ranks(self) -> bool:
        return any(r.local for r in self.ranks)

    def rank_by_pid(self, pid: int) -> RankRuntime | None:
        return next((r for r in self.ranks if r.pid == pid), None)

    @property
    def served_by(self) -> str | None:
        """The host whose exod serves requests, when it is not this one (rank 0 runs there)."""
        return None if self.ranks[0].local else self.ranks[0].host

    @property
    def model_info(self) -> m.Ready | None:
        """The vocabulary and context window of the model as rank 0 loaded it."""
        return self.ranks[0].model_info

    def serving_link(self) -> RunnerChannel | None:
        """The channel requests go through: rank 0's, while the whole instance is ready."""
        pid = self.ranks[0].pid
        if self.state is not State.READY or pid is None:
            return None
        return self.seam.link(pid)

    def _remote_follow(self, state: State, reason: str = "") -> None:
        """Ranks on other hosts are run by those hosts' daemons. What this daemon knows of them
        comes from its own ranks: they turn ready only after a barrier across the whole group,
        and they exit when the group breaks."""
        for rank in self.ranks:
            if not rank.local and rank.machine.state is not state and rank.machine.can(state):
                rank.machine.move(state, self.seam.now(), reason)

    # ---- events from runners ----------------------------------------------------------------
    def on_message(self, pid: int, msg: m.FromRunner) -> None:
        """A lifecycle report from a runner's channel (requests' events go to their streams)."""
        rank = self.rank_by_pid(pid)
        if rank is None:
            return
        now = self.seam.now()
        if not rank.heard(msg, now):
            return  # a heartbeat, or a repeat: nothing anyone sees changed
        log = self.log.bind(rank=rank.rank, pid=pid)
        if isinstance(msg, m.Status):
            self._watch_forming()
        elif isinstance(msg, m.Progress):
            self._progress(rank)
        elif isinstance(msg, m.Failed):
            log.error("{}", rank.error)
        elif isinstance(msg, m.Stopping):
            log.debug("runner is stopping")
        elif isinstance(msg, m.Ready):
            self._ready(rank, now)
            log.info("ready")
        self._changed()

    def _progress(self, rank: RankRuntime) -> None:
        if rank.state is State.STARTING:
            rank.move(State.LOADING, self.seam.now())
            if self.state is State.STARTING:
                self._move(State.LOADING, publish=False)

    def _ready(self, rank: RankRuntime, now: float) -> None:
        if rank.state not in (State.STARTING, State.LOADING):
            return
        rank.move(State.READY, now)
        if all(r.state is State.READY for r in self.ranks if r.local) and self.state in (
            State.STARTING, State.LOADING
        ):
            self._remote_follow(State.READY, "ready (group barrier passed)")
            self.tracker.on_ready(now)
            self._move(State.READY, publish=False)

    def on_broken(self, pid: int, why: str) -> None:
        """The runner broke its channel's protocol: it is failed, and ends through the ladder
        like a rank that died (its group is stopped, and the restart policy decides)."""
        rank = self.rank_by_pid(pid)
        if rank is None or rank.state is State.STOPPING:
            return
        rank.error = why
        if self.state is State.STOPPING or not self.state.active:
            self._stop_ranks()
            return
        self._fail_stopping(self.tracker.on_exit(self.seam.now(), ExitInfo(code=EXIT_PROTOCOL),
                                                 why), f"rank {rank.rank}: {why}")

    def _watch_forming(self) -> None:
        if self.state is State.STARTING and forming.all_joining(self.ranks):
            self.forming.arm(self.config.peer_timeout, self._not_formed)

    def _not_formed(self, within: float) -> None:
        if self.state is not State.STARTING or not forming.all_joining(self.ranks):
            return
        why = forming.not_formed(within)
        self.hung = f"hung connecting: {why}"
        self.log.bind(event="hung").error("{}: restarting on new ports", why)
        self._fail_stopping(self.tracker.on_exit(self.seam.now(), Hung(), why), self.hung)

    def on_exit(self, pid: int, info: ExitInfo) -> None:
        rank = self.rank_by_pid(pid)
        if rank is not None:
            self._rank_gone(rank, info)

    def _rank_gone(self, rank: RankRuntime, info: ExitInfo) -> None:
        expected = rank.state is State.STOPPING
        how = rank.gone(info, self.seam.now(), self.log)
        if self.state is State.STOPPING:
            if not self.alive():
                self._finish_stop()
            else:
                self._changed()
            return
        # `expected` cannot happen outside STOPPING. An instance no longer active has had its
        # fate decided: by another rank that failed to spawn in the same start.
        if expected or not self.state.active:
            self._changed()
            return
        decision = self.tracker.on_exit(self.seam.now(), info, rank.error,
                                        counts=not rank.shortage)
        if self.alive():
            # A group is all or nothing: stop the siblings (through the ladder), then decide.
            self._fail_stopping(decision, f"rank {rank.rank} {how}")
        else:
            self._apply(decision)

    # ---- stopping the ranks -----------------------------------------------------------------
    def _stop_ranks(self) -> None:
        for rank in self.alive():
            if rank.ladder is None:
                rank.begin_stop(self.seam, self.config.stop, self.rungs_used, self.log)

    def hurry(self) -> None:
        """A second stop signal to the daemon: skip what is left of rung 1's grace."""
        for rank in self.ranks:
            if rank.ladder is not None and rank.pid is not None:
                rank.ladder.hurry()

    # ---- what the instance decides (exod.daemon.instance) -----------------------------------
    def _move(self, new: State, reason: str = "", publish: bool = True) -> None: ...

    def _changed(self) -> None:
        """Publish the instance's new status."""

    def _fail_stopping(self, decision: Decision, reason: str) -> None: ...

    def _finish_stop(self, reason: str = "") -> None: ...

    def _apply(self, decision: Decision) -> None: ...
