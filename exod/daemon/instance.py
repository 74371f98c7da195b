"""One instance: its state machine, the commands it takes (start, stop, retire, restart), what
follows a stop (the intent its STOPPING state carries: exod.core.intents) and its restarts.
It holds its ranks as a group (exod.daemon.group), which reports what their runners do and
stops them through the ladder.

Everything that touches the OS goes through `InstanceSeam` (exod.daemon.instance_seam: spawn,
ask, signal, clock, timers), so this logic runs in unit tests with a fake seam and a fake
clock, and in the daemon with the real one. The instance never blocks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from loguru import logger

from exod.config.schema import Instance
from exod.core.durations import format_duration
from exod.core import intents
from exod.core.exits import ExitInfo, Hung
from exod.core.intents import Again, Intent, Recover, Retire, StopJob
from exod.core.ports import NoFreePorts
from exod.core.restarts import Decision, GiveUp, Rest, Restart, RestartTracker
from exod.core.shards import Shard
from exod.core.states import Machine, State
from exod.daemon.clock import Timer
from exod.daemon.group import RankGroup
from exod.daemon.idle import IdleClock
from exod.daemon.lane import Lane
from exod.daemon.instance_seam import Continuation, InstanceSeam
from exod.daemon.rank import RankRuntime

if TYPE_CHECKING:
    from exod.daemon.channel import RunnerChannel
    from exod.daemon.downloads import Download, Outcome
    from exod.daemon.launch import GroupPlan
    from exod.wire import messages as m

class InstanceRuntime:
    def __init__(self, config: Instance, shards: list[Shard],
                 seam: InstanceSeam[InstanceRuntime]) -> None:
        self.seam = seam
        self.config = config
        self.name = config.name
        self.machine = Machine(since=seam.now())
        self.tracker = RestartTracker(config.restart, config.backoff, config.start_limit)
        self.started_at: float | None = None
        self.job: StopJob | None = None  # the stop in progress, or the last one until a start
        self.memory_need: int | None = None  # bytes this host's ranks need (at admission)
        self.refused = ""  # why memory admission refused the last start
        self.hung = ""
        self._restart_timer: Timer | None = None
        self.download: Download | None = None  # while downloading: the download it waits for
        self.auto_width: int | None = None  # max_concurrency unset: what memory admission chose
        self.log = logger.bind(instance=self.name)
        # Its parts, made and dropped with it (nothing of it is kept by name elsewhere):
        self.group = RankGroup(shards, seam, self)  # its ranks, their reports and ladders
        self.lane = Lane(self)  # its requests: queue, hang watch, what its files say
        self.idle = IdleClock(self)  # when it was last used, and its idle stop
        self.prefetch: Instance | None = None  # a reload's new config, waiting for its model
        self.group_plan: GroupPlan | None = None  # a group's addresses, from its last start

    def sized(self, need: int | None, auto_width: int | None) -> None:
        """What memory admission found (exod.daemon.memory_check): the bytes this host's ranks
        need (None: it cannot be told), and the width it chose if max_concurrency is unset."""
        self.memory_need = need
        self.auto_width = auto_width

    # ---- queries -------------------------------------------------------------------------
    @property
    def state(self) -> State:
        return self.machine.state

    @property
    def ranks(self) -> list[RankRuntime]:
        return self.group.ranks

    def alive(self) -> list[RankRuntime]:
        return self.group.alive()

    @property
    def served_by(self) -> str | None:
        return self.group.served_by

    @property
    def model_info(self) -> m.Ready | None:
        return self.group.model_info

    def serving_link(self) -> RunnerChannel | None:
        return self.group.serving_link()

    @property
    def width(self) -> int:
        """Generations at once: max_concurrency, else as sized by memory admission."""
        return self.config.max_concurrency or self.auto_width or 1

    @property
    def fair(self) -> bool:
        """Rank 0's engine shares its batch between keys, as it last said."""
        serving = self.ranks[0].serving if self.ranks else None
        return serving is not None and serving.fair

    @property
    def start_pending(self) -> bool:
        """A start waits for the stop in progress to complete."""
        return self._stopping_to(Again)

    @property
    def held(self) -> bool:
        """An operator stopped it, and no operator started it since: a reload does not start
        it (nor its replacement)."""
        return self.job is not None and intents.holds(self.job.then)

    @property
    def retired(self) -> bool:
        """A reload removed or replaced it, and its stop is complete: it never starts again."""
        return (self.state is State.STOPPED and self.job is not None
                and isinstance(self.job.then, Retire))

    @property
    def retiring(self) -> bool:
        """Stopping for a reload, which drops or replaces it once it is stopped."""
        return self._stopping_to(Retire)

    def _stopping_to(self, kind: type[Intent]) -> bool:
        return (self.state is State.STOPPING and self.job is not None
                and isinstance(self.job.then, kind))

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

    # ---- what the group reports (exod.daemon.group.GroupOwner) ------------------------------
    def group_changed(self) -> None:
        self.seam.changed(self)

    def group_loading(self) -> None:
        if self.state is State.STARTING:
            self._move(State.LOADING, publish=False)

    def group_ready(self, now: float) -> None:
        if self.state in (State.STARTING, State.LOADING):
            self.group.remote_follow(State.READY, "ready (group barrier passed)")
            self.tracker.on_ready(now)
            self._move(State.READY, publish=False)

    def group_failed(self, info: ExitInfo, error: str, reason: str, counts: bool = True) -> None:
        decision = self.tracker.on_exit(self.seam.now(), info, error, counts=counts)
        if self.group.alive():
            # A group is all or nothing: stop the siblings (through the ladder), then decide.
            self._fail_stopping(decision, reason)
        else:
            self._apply(decision)

    def group_not_formed(self, why: str) -> None:
        self.hung = f"hung connecting: {why}"
        self.log.bind(event="hung").error("{}: restarting on new ports", why)
        self._fail_stopping(self.tracker.on_exit(self.seam.now(), Hung(), why), self.hung)

    def group_stopped(self) -> None:
        self._finish_stop()

    # ---- events from the process table, for the group --------------------------------------
    def on_message(self, pid: int, msg: m.FromRunner) -> None:
        self.group.on_message(pid, msg)

    def on_broken(self, pid: int, why: str) -> None:
        self.group.on_broken(pid, why)

    def on_exit(self, pid: int, info: ExitInfo) -> None:
        self.group.on_exit(pid, info)

    def hurry(self) -> None:
        """A second stop signal to the daemon: skip what is left of rung 1's grace."""
        self.group.hurry()

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
            self.tracker.reset()
        if self.job is not None and self.state is State.STOPPING:
            self.job.then = intents.on_start(self.job.then, operator)
            return
        if self.state.active:
            return
        if operator:
            self.job = None  # an operator's start releases a hold
        if not self.group.has_local_ranks:
            self.log.info("not started here: every rank runs on another host")
            return
        self._cancel_restart()
        self.group.forming.cancel()
        self.job = None
        self.hung = ""
        why = "started by operator" if operator else ""
        if self.names_hub and not self.seam.cached(self):
            self._move(State.DOWNLOADING, why)
            self._fetch()
            return
        self._launch(why)

    @property
    def names_hub(self) -> bool:
        """Its model or its draft model is a hub repository."""
        return self.config.hub is not None or self.config.draft_hub is not None

    def fetched(self, outcome: Outcome, draft: bool = False) -> None:
        """The download this instance waited for is over (its draft model's: `draft`, whose
        path the seam has already told it: use_draft)."""
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
            self._fetch()  # the draft model next, still downloading
            return
        self._launch("model fetched")

    def _fetch(self) -> None:
        d = self.seam.fetch(self)
        if self.state is State.DOWNLOADING:  # not failed at once (the fetcher cannot start)
            self.download = d

    def use_model(self, path: Path, shards: list[Shard], node: str) -> None:
        """Its model's files are at `path` (a hub model's snapshot), in these shards."""
        self.config = dataclasses.replace(self.config, model=path)
        self.group.reshard(shards, node)

    def use_draft(self, path: Path) -> None:
        self.config = dataclasses.replace(self.config, draft_model=path)

    def _launch(self, why: str) -> None:
        """Admission, then spawn every local rank."""
        if not self._admitted():
            return
        self.group.remote_follow(State.STARTING, "remote")
        self._move(State.STARTING, why)
        self.group.start(lambda rank: self.seam.spawn(self, rank))

    def stop(self, then: Continuation | None = None, operator: bool = False) -> None:
        """Stop every rank through the ladder; `then` runs once all are gone. Any stop
        (operator, reload, shutdown) cancels a start that was waiting for a stop: otherwise a
        shutdown could spawn a runner and never finish."""
        self._ask_stop(lambda now: intents.on_stop(now, operator), then,
                       "stopped by operator" if operator else "")

    def retire(self, replacement: Instance | None) -> None:
        """A reload removed it (`replacement` None) or changed it: stop it through the ladder;
        once every runner is gone the seam drops it or puts the replacement in its place."""
        running = self.state is not State.STOPPED
        self._ask_stop(lambda now: intents.on_retire(now, replacement, running), None, "")

    def _ask_stop(self, intent: Callable[[Intent | None], Intent], then: Continuation | None,
                  reason: str) -> None:
        """`intent` merges the new request into what the stop in progress (or the last one)
        asked, so a second request never runs a second ladder."""
        job = self.job
        waiters = [then] if then is not None else []
        if job is not None and self.state is State.STOPPING:
            job.then = intent(job.then)
            job.waiters += waiters
            return
        self._cancel_restart()
        self.job = StopJob(intent(job.then if job is not None else None), waiters)
        if self.state in (State.STOPPED, State.FAILED, State.BACKOFF):
            self._finish_stop(reason)
            return
        downloading = self.state is State.DOWNLOADING
        self._move(State.STOPPING, "stop requested")
        if downloading:  # no runner exists yet: only the fetcher, if nobody else waits for it
            self.download = None
            self.seam.unfetch(self, self._fetch_gone)
            return
        self.group.stop()

    def _fail_stopping(self, decision: Decision, reason: str) -> None:
        """A failure: stop what is left of the group, then follow the restart policy."""
        self.job = StopJob(Recover(decision))
        self._move(State.STOPPING, reason)
        self.group.stop()

    def _fetch_gone(self) -> None:
        if self.state is State.STOPPING and not self.group.alive():
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
        self._fail_stopping(self.tracker.on_exit(
            self.seam.now(), Hung(), f"no progress for {format_duration(silent_for)}"), self.hung)

    def _finish_stop(self, reason: str = "") -> None:
        """Every process is gone: what the stop asked for follows, then its waiters run."""
        job = self.job
        assert job is not None
        self.group.remote_follow(State.STOPPED)
        waiters, job.waiters = job.waiters, []
        then = job.then
        if isinstance(then, Recover):
            self.job = None
            self._apply(then.decision)
        else:
            self._move(State.STOPPED, reason)
            if isinstance(then, Retire):
                self.seam.retired(self, then)
        for fn in waiters:
            fn()
        if isinstance(then, Again) and self.job is job:  # no waiter asked for a new stop
            self.start(operator=then.operator)

    def _apply(self, decision: Decision) -> None:
        self.group.remote_follow(State.STOPPED)
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

