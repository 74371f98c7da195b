"""One instance: a group of ranks, its state machine, restarts and stop ladders.

Everything that touches the OS goes through `Seam` (spawn, ask, signal, clock, timers), so this
logic runs in unit tests with a fake seam and a fake clock, and in the daemon with the real one.
Events come in (`on_message` from a runner's channel, `on_broken`, `on_exit`, operator calls);
the instance never blocks.
"""

from __future__ import annotations

import collections
import errno
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from loguru import logger

from exod import messages as m
from exod.config.schema import Instance
from exod.config.durations import format_duration
from exod.core.exits import EXIT_PROTOCOL, EXIT_TEMPFAIL, EXIT_UNAVAILABLE, ExitInfo, Hung
from exod.core.ladder import LadderRun, Step
from exod.core.ports import NoFreePorts
from exod.core.restarts import Decision, GiveUp, Rest, Restart, RestartTracker
from exod.core.shards import Shard
from exod.core.states import Machine, State

# The least time a group on this host alone may take to form once every rank is joining it:
# MLX's ring waits up to 8 s between its own connection attempts.
FORM_WITHIN_AT_LEAST = 30.0

if TYPE_CHECKING:
    from exod.daemon.channel import RunnerChannel
    from exod.daemon.downloads import Download, Outcome

Continuation = Callable[[], None]
PERMANENT_SPAWN_ERRORS = frozenset({errno.ENOENT, errno.EACCES, errno.ENOEXEC, errno.ENOTDIR})
# The host is short of something right now: retried with backoff, never counted toward the
# start limit (the runner did nothing wrong).
SHORTAGE_SPAWN_ERRORS = frozenset({errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.ENOMEM})


class Timer(Protocol):
    def cancel(self) -> None: ...


class Seam(Protocol):
    def now(self) -> float: ...

    def call_at(self, when: float, fn: Callable[[], None]) -> Timer: ...

    def admit(self, inst: InstanceRuntime) -> str | None:
        """Why this host cannot start `inst` now (memory), or None to go ahead."""
        ...

    def prepare(self, inst: InstanceRuntime) -> None:
        """A group is about to start: agree on its addresses (e.g. write the hostfile)."""
        ...

    def spawn(self, inst: InstanceRuntime, rank: RankRuntime) -> int:
        """Start the runner for `rank`; returns its pid; raises OSError when exec fails."""
        ...

    def ask(self, pid: int, drain: float, grace: float = 0.0) -> bool:
        """Send the shutdown request over the runner's channel."""
        ...

    def kill(self, pid: int, sig: int) -> bool: ...

    def link(self, pid: int) -> RunnerChannel | None:
        """The open channel to a live runner, if any."""
        ...

    def changed(self, inst: InstanceRuntime) -> None:
        """State or progress changed: refresh status, wake waiters."""
        ...

    def cached(self, inst: InstanceRuntime) -> bool:
        """A hub model is in the cache, checked: `inst.config.model` now names its snapshot."""
        ...

    def fetch(self, inst: InstanceRuntime) -> None:
        """Fetch a hub model (sharing a download in progress); `inst.fetched` is called when
        it is done, with the snapshot or the reason it cannot be fetched."""
        ...

    def unfetch(self, inst: InstanceRuntime, then: Continuation) -> None:
        """`inst` no longer waits for its download; `then` once no fetcher runs for it."""
        ...

    def use_model(self, inst: InstanceRuntime, path: Path) -> None:
        """The model's files are at `path`: plan the ranks from its config.json."""
        ...


@dataclass
class RankRuntime:
    shard: Shard
    host: str = ""
    local: bool = True
    machine: Machine = field(default_factory=Machine)
    pid: int | None = None
    started_at: float | None = None
    layers_loaded: int = 0
    layers_total: int = 0
    last_progress: float | None = None
    phase: m.Phase | None = None  # what the runner last said it was doing
    status_text: str = ""
    attempt: int = 0  # joining its group: which attempt
    model_info: m.Ready | None = None  # vocabulary and context, once ready
    shortage: bool = False  # its last spawn failed for want of fds or memory on this host
    error: str = ""
    last_exit: ExitInfo | None = None
    ladder: LadderRun | None = None
    ladder_timer: Timer | None = None
    signals_sent: list[str] = field(default_factory=list)
    last_heartbeat: float | None = None
    serving: m.Serving | None = None  # the engine's figures, as the runner last sent them

    @property
    def rank(self) -> int:
        return self.shard.rank

    @property
    def state(self) -> State:
        return self.machine.state


class InstanceRuntime:
    def __init__(self, config: Instance, shards: list[Shard], seam: Seam) -> None:
        self.config = config
        self.name = config.name
        self.seam = seam
        self.machine = Machine(since=seam.now())
        self.tracker = RestartTracker(config.restart, config.backoff, config.start_limit)
        self.ranks = [RankRuntime(shard=s, layers_total=s.count) for s in shards]
        self.started_at: float | None = None
        self.held = False  # an operator stopped it: a reload must not start it again
        self.memory_need: int | None = None  # bytes this host's ranks need (at admission)
        self.refused = ""  # why memory admission refused the last start
        self.hung = ""  # e.g. "hung (no progress for 5m)": why it is being restarted
        self.retired = False  # replaced or removed by a reload: it never starts again
        self._pending: Decision | None = None  # applied once every rank is gone
        self._after_stop: list[Continuation] = []  # notifications: always run
        self._start_after_stop: bool | None = None  # deferred start (by operator?), if any
        self._restart_timer: Timer | None = None
        self._forming_timer: Timer | None = None  # a group on this host alone must form by then
        self.rungs_used: collections.Counter[str] = collections.Counter()  # ladder steps taken
        self.download: Download | None = None  # while downloading: the download it waits for
        self.auto_width: int | None = None  # max_concurrency unset: what memory admission chose
        self.log = logger.bind(instance=self.name)

    # ---- queries -------------------------------------------------------------------------
    @property
    def state(self) -> State:
        return self.machine.state

    @property
    def width(self) -> int:
        """Generations at once: max_concurrency, else as sized by memory admission."""
        return self.config.max_concurrency or self.auto_width or 1

    def alive(self) -> list[RankRuntime]:
        return [r for r in self.ranks if r.pid is not None]

    @property
    def has_local_ranks(self) -> bool:
        return any(r.local for r in self.ranks)

    def _remote_follow(self, state: State, reason: str = "") -> None:
        """Ranks on other hosts are run by those hosts' daemons. What this daemon knows of them
        comes from its own ranks: they turn ready only after a barrier across the whole group,
        and they exit when the group breaks."""
        for rank in self.ranks:
            if not rank.local and rank.machine.state is not state and rank.machine.can(state):
                rank.machine.move(state, self.seam.now(), reason)

    @property
    def start_pending(self) -> bool:
        """A start waits for the stop in progress to complete."""
        return self._start_after_stop is not None

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

    # ---- transitions ----------------------------------------------------------------------
    def _move(self, new: State, reason: str = "", publish: bool = True) -> None:
        """`publish=False`: the caller publishes once, after every change of the event."""
        if self.machine.state is new:
            return
        old = self.machine.state
        self.machine.move(new, self.seam.now(), reason)
        self.log.bind(event="state", old=old.value, new=new.value).info(
            "{} → {}{}", old, new, f" ({reason})" if reason else "")
        if publish:
            self.seam.changed(self)

    def _move_rank(self, rank: RankRuntime, new: State, reason: str = "") -> None:
        if rank.machine.state is not new:
            rank.machine.move(new, self.seam.now(), reason)

    def _admitted(self) -> bool:
        """Memory allows the start and the group's files are written; else the instance fails
        before any runner exists (not a failure counted towards the start limit)."""
        self.refused = refusal = self.seam.admit(self) or ""
        if not refusal:
            self.started_at = self.seam.now()
            try:
                self.seam.prepare(self)
                return True
            except OSError as e:  # the hostfile or group key cannot be written (disk, perms)
                refusal = f"cannot prepare the group: {e}"
            except NoFreePorts as e:
                refusal = f"cannot prepare the group: {e}"
        self.log.error("not started: {}", refusal)
        self._move(State.STARTING, publish=False)
        self._move(State.FAILED, refusal)
        return False

    # ---- operator and supervisor calls ----------------------------------------------------
    def start(self, operator: bool = False) -> None:
        """Start every local rank. From stopping, start once the stop is complete."""
        if self.retired:  # a start deferred past its reload's swap: the replacement runs
            return
        if operator:
            self.held = False
            self.tracker.reset()
        if self.state is State.STOPPING:
            self._start_after_stop = operator or bool(self._start_after_stop)
            return
        if self.state.active:
            return
        if not self.has_local_ranks:
            self.log.info("not started here: every rank runs on another host")
            return
        self._cancel_restart()
        self._cancel_forming()
        self._pending = None
        self.hung = ""
        why = "started by operator" if operator else ""
        if self.names_hub and not self.seam.cached(self):
            self._move(State.DOWNLOADING, why)
            self.seam.fetch(self)
            return
        self._launch(why)

    @property
    def names_hub(self) -> bool:
        """Its model or its draft model is a hub repository."""
        return self.config.hub is not None or self.config.draft_hub is not None

    def fetched(self, outcome: Outcome, draft: bool = False) -> None:
        """The download this instance waited for is over (its draft model's: `draft`, whose
        path the seam has already put in the config)."""
        self.download = None
        if self.state is not State.DOWNLOADING:
            return
        if outcome.path is None:
            self.log.error("not started: {}", outcome.error)
            self._move(State.FAILED, outcome.error)
            return
        if not draft:
            self.seam.use_model(self, outcome.path)
        if self.config.draft_hub is not None and not self.seam.cached(self):
            self.seam.fetch(self)  # the draft model next, still downloading
            return
        self._launch("model fetched")

    def _launch(self, why: str) -> None:
        """Admission, then spawn every local rank."""
        if not self._admitted():
            return
        self._remote_follow(State.STARTING, "remote")
        self._move(State.STARTING, why)
        failed: list[tuple[RankRuntime, str, int]] = []
        for rank in self.ranks:
            if not rank.local:
                continue
            rank.layers_loaded, rank.error, rank.status_text = 0, "", ""
            rank.phase, rank.attempt, rank.model_info = None, 0, None
            rank.signals_sent, rank.last_progress, rank.last_heartbeat = [], None, None
            rank.serving = None
            rank.started_at = self.seam.now()
            rank.shortage = False
            self._move_rank(rank, State.STARTING)
            try:
                rank.pid = self.seam.spawn(self, rank)
            except OSError as e:
                rank.shortage = e.errno in SHORTAGE_SPAWN_ERRORS
                # A missing or unusable interpreter will not fix itself; EAGAIN/ENOMEM may.
                code = EXIT_UNAVAILABLE if e.errno in PERMANENT_SPAWN_ERRORS else EXIT_TEMPFAIL
                failed.append((rank, f"cannot start runner: {e}", code))
                continue
            except Exception as e:  # noqa: BLE001 -- our bug: fail the instance, not the daemon
                self.log.opt(exception=True).error("cannot start rank {}", rank.rank)
                failed.append((rank, f"internal error starting the runner: {e!r}",
                               EXIT_UNAVAILABLE))
                continue
            self.log.bind(rank=rank.rank, pid=rank.pid).info(
                "started, layers [{}, {})", rank.shard.start, rank.shard.end)
        for rank, why, code in failed:
            rank.error = why
            self._rank_gone(rank, ExitInfo(code=code))

    def stop(self, then: Continuation | None = None, operator: bool = False) -> None:
        """Stop every rank through the ladder; `then` runs once all are gone."""
        if operator:
            self.held = True
        # Any stop (operator, reload, shutdown) cancels a start that was waiting for a stop:
        # otherwise a shutdown could spawn a runner and never finish.
        self._start_after_stop = None
        if then is not None:
            self._after_stop.append(then)
        self._cancel_restart()
        self._pending = None
        if self.state in (State.STOPPED, State.FAILED, State.BACKOFF):
            self._move(State.STOPPED, "stopped by operator" if operator else "")
            self._run_after_stop()
            return
        if self.state is State.STOPPING:
            return
        downloading = self.state is State.DOWNLOADING
        self._move(State.STOPPING, "stop requested")
        if downloading:  # no runner exists yet: only the fetcher, if nobody else waits for it
            self.download = None
            self.seam.unfetch(self, self._fetch_gone)
            return
        self._stop_ranks()

    def _fetch_gone(self) -> None:
        if self.state is State.STOPPING and not self.alive():
            self._finish_stop()

    def restart(self) -> None:
        self.stop()
        self.start(operator=True)  # deferred until the stop completes, if one is running

    def hang(self, silent_for: float) -> None:
        """Requests were in flight and the runner made no progress for `silent_for` seconds:
        restart through the ladder, counted as a failure."""
        if self.state is not State.READY:
            return
        self.hung = f"hung (no progress for {format_duration(silent_for)})"
        self.log.bind(event="hung").error("{}: restarting through the ladder", self.hung)
        self._pending = self.tracker.on_exit(self.seam.now(), Hung(),
                                             f"no progress for {format_duration(silent_for)}")
        self._move(State.STOPPING, self.hung)
        self._stop_ranks()

    def hurry(self) -> None:
        """A second stop signal to the daemon: skip what is left of rung 1's grace."""
        now = self.seam.now()
        for rank in self.ranks:
            if rank.ladder is not None and rank.pid is not None:
                rank.ladder.skip_grace(now)
                self._schedule_ladder(rank)

    # ---- events from runners --------------------------------------------------------------
    def on_message(self, pid: int, msg: m.FromRunner) -> None:
        """A lifecycle report from a runner's channel (requests' events go to their streams)."""
        rank = self.rank_by_pid(pid)
        if rank is None:
            return
        now = self.seam.now()
        log = self.log.bind(rank=rank.rank, pid=pid)
        if isinstance(msg, m.Heartbeat):
            # Nothing to publish: status derives the heartbeat's age when asked. (A snapshot per
            # watcher per heartbeat let a flooding runner starve the loop and drop watchers.)
            rank.last_heartbeat = now
            return
        if isinstance(msg, m.Status):
            before = (rank.phase, rank.status_text, rank.attempt)
            rank.phase, rank.status_text, rank.attempt = msg.phase, _clip(msg.text), msg.attempt
            if (rank.phase, rank.status_text, rank.attempt) == before:
                return  # a repeat changes nothing anyone sees
            self._watch_forming()
        elif isinstance(msg, m.Progress):
            self._progress(rank, msg, now)
        elif isinstance(msg, m.Serving):
            rank.serving = msg
        elif isinstance(msg, m.Failed):
            reason = _clip(msg.reason)
            rank.error, rank.phase, rank.status_text = reason, m.Phase.FAILED, reason
            log.error("{}", reason)
        elif isinstance(msg, m.Stopping):
            rank.phase, rank.status_text = m.Phase.STOPPING, "stopping"
            log.debug("runner is stopping")
        elif isinstance(msg, m.Ready):
            self._ready(rank, msg, now)
            log.info("ready")
        self.seam.changed(self)

    def _ready(self, rank: RankRuntime, msg: m.Ready, now: float) -> None:
        rank.model_info, rank.phase, rank.status_text = msg, m.Phase.READY, "ready"
        if rank.state not in (State.STARTING, State.LOADING):
            return
        self._move_rank(rank, State.READY)
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
        self._pending = self.tracker.on_exit(self.seam.now(), ExitInfo(code=EXIT_PROTOCOL), why)
        self._move(State.STOPPING, f"rank {rank.rank}: {why}")
        self._stop_ranks()

    def _watch_forming(self) -> None:
        """Every rank of a group whose ranks all run on this host is joining it: the group
        forms within seconds, or something holds its ports (a rank's MLX listener sharing its
        port with another program's waits in accept() forever). Across hosts, waiting is
        right: a peer host may be down for hours."""
        if self._forming_timer is None and self.state is State.STARTING and self._all_joining():
            within = max(self.config.peer_timeout, FORM_WITHIN_AT_LEAST)
            self._forming_timer = self.seam.call_at(self.seam.now() + within,
                                                    lambda: self._not_formed(within))

    def _all_joining(self) -> bool:
        return len(self.ranks) > 1 and all(
            r.local and r.pid is not None and r.phase is m.Phase.CONNECTING for r in self.ranks)

    def _not_formed(self, within: float) -> None:
        self._forming_timer = None
        if self.state is not State.STARTING or not self._all_joining():
            return
        why = (f"the group did not form within {format_duration(within)} although all its "
               "ranks run on this host (ports held by another program?)")
        self.hung = f"hung connecting: {why}"
        self.log.bind(event="hung").error("{}: restarting on new ports", why)
        self._pending = self.tracker.on_exit(self.seam.now(), Hung(), why)
        self._move(State.STOPPING, self.hung)
        self._stop_ranks()

    def _cancel_forming(self) -> None:
        if self._forming_timer is not None:
            self._forming_timer.cancel()
            self._forming_timer = None

    def _progress(self, rank: RankRuntime, msg: m.Progress, now: float) -> None:
        rank.layers_loaded, rank.layers_total, rank.last_progress = msg.loaded, msg.total, now
        rank.phase, rank.status_text = m.Phase.LOADING, f"loading {msg.loaded}/{msg.total}"
        if rank.state is State.STARTING:
            self._move_rank(rank, State.LOADING)
            if self.state is State.STARTING:
                self._move(State.LOADING, publish=False)

    def on_exit(self, pid: int, info: ExitInfo) -> None:
        rank = self.rank_by_pid(pid)
        if rank is not None:
            self._rank_gone(rank, info)

    def _rank_gone(self, rank: RankRuntime, info: ExitInfo) -> None:
        killed = Step.KILL.value in rank.signals_sent
        log = self.log.bind(rank=rank.rank, pid=rank.pid, event="exit", code=info.code,
                            signal=info.signal, signals_sent=list(rank.signals_sent))
        rank.pid, rank.last_exit, rank.serving = None, info, None  # its cache died with it
        if rank.ladder_timer is not None:
            rank.ladder_timer.cancel()
        rank.ladder, rank.ladder_timer = None, None
        expected = rank.state is State.STOPPING
        how = f"{info}{' after SIGKILL' if killed else ''}"
        if expected:
            self._move_rank(rank, State.STOPPED, how)
            (log.warning if killed or not info.clean else log.info)("exited: {}", how)
        else:
            self._move_rank(rank, State.FAILED, rank.error or how)
            log.error("exited unexpectedly: {}{}", how, f" ({rank.error})" if rank.error else "")

        if self.state is State.STOPPING:
            if not self.alive():
                self._finish_stop()
            else:
                self.seam.changed(self)
            return
        # `expected` cannot happen outside STOPPING. An instance no longer active has had its
        # fate decided: by another rank that failed to spawn in the same start.
        if expected or not self.state.active:
            self.seam.changed(self)
            return
        decision = self.tracker.on_exit(self.seam.now(), info, rank.error,
                                        counts=not rank.shortage)
        if self.alive():
            # A group is all or nothing: stop the siblings (through the ladder), then decide.
            self._pending = decision
            self._move(State.STOPPING, f"rank {rank.rank} {how}")
            self._stop_ranks()
        else:
            self._apply(decision)

    # ---- internals ------------------------------------------------------------------------
    def _stop_ranks(self) -> None:
        for rank in self.alive():
            if rank.ladder is None:
                self._begin_ladder(rank)

    def _begin_ladder(self, rank: RankRuntime) -> None:
        self._move_rank(rank, State.STOPPING)
        rank.ladder = LadderRun(self.config.stop, self.seam.now())
        self._perform(rank, rank.ladder.first)
        self._schedule_ladder(rank)

    def _schedule_ladder(self, rank: RankRuntime) -> None:
        if rank.ladder_timer is not None:
            rank.ladder_timer.cancel()
        if rank.ladder is not None:
            rank.ladder_timer = self.seam.call_at(rank.ladder.deadline, lambda: self._tick(rank))

    def _tick(self, rank: RankRuntime) -> None:
        rank.ladder_timer = None
        if rank.ladder is None or rank.pid is None:
            return
        step = rank.ladder.due(self.seam.now())
        if step is not None:
            self._perform(rank, step)
        self._schedule_ladder(rank)

    def _perform(self, rank: RankRuntime, step: Step) -> None:
        pid = rank.pid
        if pid is None:
            return
        rank.signals_sent.append(step.value)
        self.rungs_used[step.value] += 1
        log = self.log.bind(rank=rank.rank, pid=pid, event="ladder", step=step.value)
        stop = self.config.stop
        if step is Step.ASK:
            # In-flight generations may run `drain` seconds, but the runner must still leave
            # within rung 1's grace: keep a second of it for the exit itself.
            # Its prompt cache is written after the drain, until the grace is nearly over.
            sent = self.seam.ask(pid, min(stop.drain, max(0.0, stop.grace - 1.0)), stop.grace)
            log.info("ladder rung 1: asking to shut down, grace {:g}s{}", stop.grace,
                     "" if sent else " (channel closed)")
        elif step is Step.TERM:
            n = rank.signals_sent.count(Step.TERM.value)
            log.warning("ladder rung 2: SIGTERM {}/{}", n, stop.attempts)
            self.seam.kill(pid, signal.SIGTERM)
        else:
            log.error("ladder rung 3: SIGKILL (still alive after every SIGTERM)")
            self.seam.kill(pid, signal.SIGKILL)

    def _finish_stop(self) -> None:
        self._remote_follow(State.STOPPED)
        decision, self._pending = self._pending, None
        if decision is not None:
            self._apply(decision)
        else:
            self._move(State.STOPPED)
        self._run_after_stop()

    def _run_after_stop(self) -> None:
        todo, self._after_stop = self._after_stop, []
        for fn in todo:
            fn()
        if self._start_after_stop is not None:
            operator, self._start_after_stop = self._start_after_stop, None
            self.start(operator=operator)

    def _apply(self, decision: Decision) -> None:
        self._remote_follow(State.STOPPED)
        if isinstance(decision, Restart):
            self._move(State.BACKOFF, f"restart in {decision.delay:.1f}s")
            when = self.seam.now() + decision.delay
            self._restart_timer = self.seam.call_at(when, self._restart_due)
        elif isinstance(decision, GiveUp):
            self._move(State.FAILED, decision.reason)
        elif isinstance(decision, Rest):
            self._move(State.STOPPED, decision.reason)

    def _restart_due(self) -> None:
        self._restart_timer = None
        if self.state is State.BACKOFF:
            self.start()

    def _cancel_restart(self) -> None:
        if self._restart_timer is not None:
            self._restart_timer.cancel()
            self._restart_timer = None


def _clip(text: str, limit: int = 2000) -> str:
    """A runner's words for status and the log: every status snapshot carries them, so a
    runaway one is cut rather than copied to every watcher."""
    return text if len(text) <= limit else text[: limit - 1] + "…"
