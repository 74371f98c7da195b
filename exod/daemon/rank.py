"""One rank of an instance: its runner's process, what the runner last reported, and its walk
down the termination ladder (through the one driver, exod.daemon.ladder_driver). What a rank's
report or exit means for its instance is the instance's to decide (exod.daemon.group)."""

from __future__ import annotations

import collections
import signal
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from exod.wire import messages as m
from exod.config.schema import StopPolicy
from exod.core.exits import ExitInfo
from exod.core.ladder import Step
from exod.core.shards import Shard
from exod.core.states import Machine, State
from exod.core.text import clip
from exod.daemon.clock import Clock
from exod.daemon.ladder_driver import LadderDriver

if TYPE_CHECKING:
    from loguru import Logger

    from exod.daemon.channel import RunnerChannel


class RankSeam(Clock, Protocol):
    """What ranks need of the OS: the runner's channel and its signals."""

    def ask(self, pid: int, drain: float, grace: float = 0.0) -> bool:
        """Send the shutdown request over the runner's channel."""
        ...

    def kill(self, pid: int, sig: int) -> bool: ...

    def link(self, pid: int) -> RunnerChannel | None:
        """The open channel to a live runner, if any."""
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
    ladder: LadderDriver | None = None  # while it is being stopped
    signals_sent: list[str] = field(default_factory=list)
    last_heartbeat: float | None = None
    serving: m.ServingReport | None = None  # the engine's figures, as the runner last sent them

    @property
    def rank(self) -> int:
        return self.shard.rank

    @property
    def state(self) -> State:
        return self.machine.state

    def move(self, new: State, now: float, reason: str = "") -> None:
        if self.machine.state is not new:
            self.machine.move(new, now, reason)

    def starting(self, now: float) -> None:
        """A new runner is about to be spawned: nothing of the last one's reports remains."""
        self.layers_loaded, self.error, self.status_text = 0, "", ""
        self.phase, self.attempt, self.model_info = None, 0, None
        self.signals_sent, self.last_progress, self.last_heartbeat = [], None, None
        self.serving = None
        self.started_at = now
        self.shortage = False

    def heard(self, msg: m.FromRunner, now: float) -> bool:
        """Record what the runner reports of itself (its instance decides what it means);
        whether anything a watcher sees changed. A heartbeat changes nothing to publish:
        status derives its age when asked. (A snapshot per watcher per heartbeat let a
        flooding runner starve the loop and drop watchers.)"""
        if isinstance(msg, m.Heartbeat):
            self.last_heartbeat = now
            return False
        if isinstance(msg, m.Status):
            before = (self.phase, self.status_text, self.attempt)
            self.phase, self.status_text, self.attempt = msg.phase, _said(msg.text), msg.attempt
            return (self.phase, self.status_text, self.attempt) != before
        if isinstance(msg, m.LoadProgress):
            self.layers_loaded, self.layers_total, self.last_progress = msg.loaded, msg.total, now
            self.phase, self.status_text = m.Phase.LOADING, f"loading {msg.loaded}/{msg.total}"
        elif isinstance(msg, m.ServingReport):
            self.serving = msg
        elif isinstance(msg, m.Failed):
            self.error = self.status_text = _said(msg.reason)
            self.phase = m.Phase.FAILED
        elif isinstance(msg, m.Stopping):
            self.phase, self.status_text = m.Phase.STOPPING, "stopping"
        elif isinstance(msg, m.Ready):
            self.model_info, self.phase, self.status_text = msg, m.Phase.READY, "ready"
        return True

    def begin_stop(self, seam: RankSeam, policy: StopPolicy, rungs: collections.Counter[str],
                   log: Logger) -> None:
        """Down the ladder, each step counted in `rungs` (the instance's, for /metrics)."""
        self.move(State.STOPPING, seam.now())
        self.ladder = LadderDriver(seam, policy,
                                   lambda step: self._perform(seam, policy, step, rungs, log))
        self.ladder.begin()

    def _perform(self, seam: RankSeam, stop: StopPolicy, step: Step,
                 rungs: collections.Counter[str], log: Logger) -> None:
        pid = self.pid
        if pid is None:
            return
        self.signals_sent.append(step.value)
        rungs[step.value] += 1
        log = log.bind(rank=self.rank, pid=pid, event="ladder", step=step.value)
        if step is Step.ASK:
            # In-flight generations may run `drain` seconds, but the runner must still leave
            # within rung 1's grace: keep a second of it for the exit itself.
            # Its prompt cache is written after the drain, until the grace is nearly over.
            sent = seam.ask(pid, min(stop.drain, max(0.0, stop.grace - 1.0)), stop.grace)
            log.info("ladder rung 1: asking to shut down, grace {:g}s{}", stop.grace,
                     "" if sent else " (channel closed)")
        elif step is Step.TERM:
            n = self.signals_sent.count(Step.TERM.value)
            log.warning("ladder rung 2: SIGTERM {}/{}", n, stop.attempts)
            seam.kill(pid, signal.SIGTERM)
        else:
            log.error("ladder rung 3: SIGKILL (still alive after every SIGTERM)")
            seam.kill(pid, signal.SIGKILL)

    def gone(self, info: ExitInfo, now: float, log: Logger) -> str:
        """The runner is reaped: stopped if it was being stopped, else failed. Returns how it
        ended, e.g. `exit code 1`, `signal 9 (SIGKILL) after SIGKILL`."""
        killed = Step.KILL.value in self.signals_sent
        log = log.bind(rank=self.rank, pid=self.pid, event="exit", code=info.code,
                       signal=info.signal, signals_sent=list(self.signals_sent))
        self.pid, self.last_exit, self.serving = None, info, None  # its cache died with it
        if self.ladder is not None:
            self.ladder.reaped()
        self.ladder = None
        how = f"{info}{' after SIGKILL' if killed else ''}"
        if self.state is State.STOPPING:
            self.move(State.STOPPED, now, how)
            (log.warning if killed or not info.clean else log.info)("exited: {}", how)
        else:
            self.move(State.FAILED, now, self.error or how)
            log.error("exited unexpectedly: {}{}", how, f" ({self.error})" if self.error else "")
        return how


STATUS_TEXT = 2000


def _said(text: str) -> str:
    """A runner's words for status and the log: every status snapshot carries them, so a
    runaway one is cut rather than copied to every watcher."""
    return clip(text, STATUS_TEXT)
