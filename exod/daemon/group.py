"""An instance's ranks as a group: what their runners' reports and exits mean for the group,
the bound on a local group forming, and starting them all and stopping them through the ladder.

Held by its `InstanceRuntime` (exod.daemon.instance), which owns the state machine and decides
what follows: the group reads the instance's state and settings and reports its events through
`GroupOwner`. Events come in from the process table (`on_message` from a runner's channel,
`on_broken`, `on_exit`); nothing here blocks, and the OS is reached only through the seam.
"""

from __future__ import annotations

import collections
import errno
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from exod.wire import messages as m
from exod.config.schema import Instance
from exod.core.exits import EXIT_PROTOCOL, EXIT_TEMPFAIL, EXIT_UNAVAILABLE, ExitInfo
from exod.core.shards import Shard
from exod.core.states import State
from exod.daemon import forming, rank_addresses
from exod.daemon.forming import FormingWatch
from exod.daemon.rank import RankRuntime, RankSeam

if TYPE_CHECKING:
    from loguru import Logger

    from exod.daemon.channel import RunnerChannel

PERMANENT_SPAWN_ERRORS = frozenset({errno.ENOENT, errno.EACCES, errno.ENOEXEC, errno.ENOTDIR})
# The host is short of something right now: retried with backoff, never counted toward the
# start limit (the runner did nothing wrong).
SHORTAGE_SPAWN_ERRORS = frozenset({errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.ENOMEM})


class GroupOwner(Protocol):
    """The instance as its group sees it: what it is doing now, its settings and its log, and
    the events it decides on."""

    @property
    def state(self) -> State: ...

    @property
    def config(self) -> Instance: ...

    @property
    def log(self) -> Logger: ...

    def group_changed(self) -> None:
        """Something a watcher sees changed: publish the instance's status."""
        ...

    def group_loading(self) -> None:
        """A rank began loading its layers."""
        ...

    def group_ready(self, now: float) -> None:
        """Every rank on this host is ready: the group's barrier passed."""
        ...

    def group_failed(self, info: ExitInfo, error: str, reason: str, counts: bool = True) -> None:
        """A rank died or broke its channel outside a stop: the restart policy decides
        (`counts=False`: the host, not the runner, was short of something)."""
        ...

    def group_not_formed(self, why: str) -> None:
        """Every rank was joining, and the group did not form in time."""
        ...

    def group_stopped(self) -> None:
        """The stop in progress is complete: no rank's runner is left."""
        ...


class RankGroup:
    def __init__(self, shards: list[Shard], seam: RankSeam, owner: GroupOwner) -> None:
        self.seam = seam
        self.owner = owner
        self.ranks = [RankRuntime(shard=s, layers_total=s.count) for s in shards]
        self.forming = FormingWatch(seam)  # a group on this host alone must form in time
        self.rungs_used: collections.Counter[str] = collections.Counter()  # ladder steps taken

    def reshard(self, shards: list[Shard], node: str) -> None:
        """The model's layers are known now (a hub model's config.json): a rank per shard."""
        if [r.shard for r in self.ranks] != shards:
            self.ranks = [RankRuntime(shard=s, layers_total=s.count) for s in shards]
            self.place(node)

    def place(self, node: str) -> None:
        """Which host runs each rank (the config's `hosts`), and so which run here, on `node`."""
        for rank in self.ranks:
            rank.host = rank_addresses.host_of(self.owner.config, rank.rank, node)
            rank.local = rank.host == node

    # ---- queries ----------------------------------------------------------------------------
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
        if self.owner.state is not State.READY or pid is None:
            return None
        return self.seam.link(pid)

    def remote_follow(self, state: State, reason: str = "") -> None:
        """Ranks on other hosts are run by those hosts' daemons. What this daemon knows of them
        comes from its own ranks: they turn ready only after a barrier across the whole group,
        and they exit when the group breaks."""
        for rank in self.ranks:
            if not rank.local and rank.machine.state is not state and rank.machine.can(state):
                rank.machine.move(state, self.seam.now(), reason)

    # ---- starting the ranks -----------------------------------------------------------------
    def start(self, spawn: Callable[[RankRuntime], int]) -> None:
        """Spawn a runner for every local rank; a rank whose runner cannot start is gone at
        once, as if it had exited (the owner hears of it once every spawn was tried)."""
        log = self.owner.log
        failed: list[tuple[RankRuntime, str, int]] = []
        for rank in self.ranks:
            if not rank.local:
                continue
            rank.starting(self.seam.now())
            rank.move(State.STARTING, self.seam.now())
            try:
                rank.pid = spawn(rank)
            except OSError as e:
                rank.shortage = e.errno in SHORTAGE_SPAWN_ERRORS
                # A missing or unusable interpreter will not fix itself; EAGAIN/ENOMEM may.
                code = EXIT_UNAVAILABLE if e.errno in PERMANENT_SPAWN_ERRORS else EXIT_TEMPFAIL
                failed.append((rank, f"cannot start runner: {e}", code))
                continue
            except Exception as e:  # noqa: BLE001 -- our bug: fail the instance, not the daemon
                log.opt(exception=True).error("cannot start rank {}", rank.rank)
                failed.append((rank, f"internal error starting the runner: {e!r}",
                               EXIT_UNAVAILABLE))
                continue
            log.bind(rank=rank.rank, pid=rank.pid).info(
                "started, layers [{}, {})", rank.shard.start, rank.shard.end)
        for rank, why, code in failed:
            rank.error = why
            self.rank_gone(rank, ExitInfo(code=code))

    # ---- events from runners ----------------------------------------------------------------
    def on_message(self, pid: int, msg: m.FromRunner) -> None:
        """A lifecycle report from a runner's channel (requests' events go to their streams)."""
        rank = self.rank_by_pid(pid)
        if rank is None:
            return
        now = self.seam.now()
        if not rank.heard(msg, now):
            return  # a heartbeat, or a repeat: nothing anyone sees changed
        log = self.owner.log.bind(rank=rank.rank, pid=pid)
        if isinstance(msg, m.Status):
            self._watch_forming()
        elif isinstance(msg, m.LoadProgress):
            self._progress(rank)
        elif isinstance(msg, m.Failed):
            log.error("{}", rank.error)
        elif isinstance(msg, m.Stopping):
            log.debug("runner is stopping")
        elif isinstance(msg, m.Ready):
            self._ready(rank, now)
            log.info("ready")
        self.owner.group_changed()

    def _progress(self, rank: RankRuntime) -> None:
        if rank.state is State.STARTING:
            rank.move(State.LOADING, self.seam.now())
            self.owner.group_loading()

    def _ready(self, rank: RankRuntime, now: float) -> None:
        if rank.state not in (State.STARTING, State.LOADING):
            return
        rank.move(State.READY, now)
        if all(r.state is State.READY for r in self.ranks if r.local):
            self.owner.group_ready(now)

    def on_broken(self, pid: int, why: str) -> None:
        """The runner broke its channel's protocol: it is failed, and ends through the ladder
        like a rank that died (its group is stopped, and the restart policy decides)."""
        rank = self.rank_by_pid(pid)
        if rank is None or rank.state is State.STOPPING:
            return
        rank.error = why
        if self.owner.state is State.STOPPING or not self.owner.state.active:
            self.stop()
            return
        self.owner.group_failed(ExitInfo(code=EXIT_PROTOCOL), why, f"rank {rank.rank}: {why}")

    def _watch_forming(self) -> None:
        if self.owner.state is State.STARTING and forming.all_joining(self.ranks):
            self.forming.arm(self.owner.config.peer_timeout, self._not_formed)

    def _not_formed(self, within: float) -> None:
        if self.owner.state is not State.STARTING or not forming.all_joining(self.ranks):
            return
        self.owner.group_not_formed(forming.not_formed(within))

    def on_exit(self, pid: int, info: ExitInfo) -> None:
        rank = self.rank_by_pid(pid)
        if rank is not None:
            self.rank_gone(rank, info)

    def rank_gone(self, rank: RankRuntime, info: ExitInfo) -> None:
        """Its runner exited, or could not be spawned."""
        expected = rank.state is State.STOPPING
        how = rank.gone(info, self.seam.now(), self.owner.log)
        state = self.owner.state
        if state is State.STOPPING:
            if not self.alive():
                self.owner.group_stopped()
            else:
                self.owner.group_changed()
            return
        # `expected` cannot happen outside STOPPING. An instance no longer active has had its
        # fate decided: by another rank that failed to spawn in the same start.
        if expected or not state.active:
            self.owner.group_changed()
            return
        self.owner.group_failed(info, rank.error, f"rank {rank.rank} {how}",
                                counts=not rank.shortage)

    # ---- stopping the ranks -----------------------------------------------------------------
    def stop(self) -> None:
        """Every live rank down the ladder (those on it already stay on their rung)."""
        for rank in self.alive():
            if rank.ladder is None:
                rank.begin_stop(self.seam, self.owner.config.stop, self.rungs_used,
                                self.owner.log)

    def hurry(self) -> None:
        """A second stop signal to the daemon: skip what is left of rung 1's grace."""
        for rank in self.ranks:
            if rank.ladder is not None and rank.pid is not None:
                rank.ladder.hurry()
