"""Downloads of hub models: one fetcher process per repository and revision, however many
instances (or `exoctl pull`s) wait for it, supervised like a runner.

A fetcher (`python -m exod.hub`) is spawned through the same process table as runners, says
hello on the same kind of channel, and is stopped through the same termination ladder (rung 1
asks it over its channel; it exits at once, and its partial files stay for the next attempt).
Nothing here times a download out: while bytes arrive it runs for as long as it takes. A fetcher
that sends no new byte for `hub.stall_after` is shown as stalled, stopped through the ladder and
started again with backoff; so is one that failed on the network once under way. Only a refusal
(not found, no access, offline and not cached, the hub unreachable with no download under way,
disk too small) ends a download with an error for its waiters. A download's life is its own
state machine (`Fetch`), its stops walk the ladder through the same driver as runners' ranks,
and its retries wait by the same backoff as restarts (reset once bytes flowed for
`reset_after`). Everything that touches the OS goes through `DownloadSeam`, so this runs in unit
tests with a fake one.
"""

from __future__ import annotations

import collections
import enum
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from loguru import logger

from exod.wire import control as cm
from exod.wire import control_status as cs
from exod.wire import messages as m
from exod.core.durations import format_duration
from exod.config.schema import BackoffPolicy, StopPolicy
from exod.core.exits import PERMANENT_EXIT_CODES, ExitInfo
from exod.core.ladder import Step
from exod.core.restarts import Backoff
from exod.core.states import Tracked
from exod.core.text import clip
from exod.daemon.clock import Clock, Timer
from exod.daemon.ladder_driver import LadderDriver
from exod.hub.files import progress_text
from exod.core.hub_ref import HubRef

RATE_WINDOW = 5.0  # seconds of samples the shown rate averages over


class DownloadSeam(Clock, Protocol):
    def spawn_fetcher(self, d: Download) -> int:
        """Start `python -m exod.hub` for `d`; its pid. Raises OSError when exec fails."""
        ...

    def ask(self, pid: int, drain: float) -> bool: ...

    def kill(self, pid: int, sig: int) -> bool: ...

    def download_changed(self, d: Download) -> None: ...


class Fetch(str, enum.Enum):
    """A download's state. The last three are final: the download is forgotten."""

    NEW = "new"  # created for its first waiter; its fetcher starts at once
    FETCHING = "fetching"  # a fetcher runs (watched for stalls)
    STOPPING = "stopping"  # its fetcher goes down the ladder (stalled, broken, left, shutdown)
    BACKOFF = "backoff"  # waiting to fetch again
    FETCHED = "fetched"  # its waiters have the snapshot
    FAILED = "failed"  # refused, or the fetcher cannot start: its waiters have the reason
    DROPPED = "dropped"  # nobody waits for it any more

    def __str__(self) -> str:
        return self.value


F = Fetch
FETCH_TRANSITIONS: dict[Fetch, frozenset[Fetch]] = {
    F.NEW: frozenset({F.FETCHING, F.FAILED}),
    F.FETCHING: frozenset({F.STOPPING, F.FETCHED, F.FAILED, F.BACKOFF, F.DROPPED}),
    # A stopped fetcher never fails its waiters: a refusal is only believed unasked.
    F.STOPPING: frozenset({F.FETCHED, F.BACKOFF, F.DROPPED}),
    F.BACKOFF: frozenset({F.FETCHING, F.FAILED, F.DROPPED}),
    F.FETCHED: frozenset(),
    F.FAILED: frozenset(),
    F.DROPPED: frozenset(),
}


@dataclass(frozen=True)
class Outcome:
    path: Path | None  # the snapshot, when fetched
    error: str = ""


Waiter = Callable[[Outcome], None]


@dataclass
class Progress:
    """What the fetcher of the current attempt said of its bytes, and when they moved."""

    done: int = 0
    total: int = 0
    verifying: bool = False
    source: str = ""  # the cluster peer the bytes come from ("": the hub)
    text: str = ""  # what the fetcher last said it does
    last_bytes_at: float = 0.0
    flowing_since: float | None = None  # the first new byte of this attempt
    samples: collections.deque[tuple[float, int]] = field(default_factory=collections.deque)

    def restart(self, now: float) -> None:
        self.verifying, self.last_bytes_at, self.flowing_since = False, now, None
        self.samples.clear()

    def update(self, msg: m.DownloadProgress, now: float) -> bool:
        """Record a report; whether bytes moved."""
        moved = (msg.done, msg.verifying, msg.total) != (self.done, self.verifying, self.total)
        if moved:
            self.last_bytes_at = now
            self.flowing_since = now if self.flowing_since is None else self.flowing_since
        if msg.verifying != self.verifying:
            self.samples.clear()
        self.done, self.total, self.verifying = msg.done, msg.total, msg.verifying
        self.source = msg.source
        self.samples.append((now, msg.done))
        while len(self.samples) > 2 and now - self.samples[0][0] > RATE_WINDOW:
            self.samples.popleft()
        return moved

    def rate(self) -> float | None:
        """Bytes per second over the last few seconds of samples."""
        if len(self.samples) < 2:
            return None
        (t0, b0), (t1, b1) = self.samples[0], self.samples[-1]
        return (b1 - b0) / (t1 - t0) if t1 > t0 else None


@dataclass
class Download:
    ref: HubRef
    commit: str | None  # the cache's commit for the revision: fetched as is, never looked up
    backoff: Backoff
    machine: Tracked[Fetch] = field(
        default_factory=lambda: Tracked(Fetch.NEW, FETCH_TRANSITIONS))
    pid: int | None = None
    progress: Progress = field(default_factory=Progress)
    error: str = ""  # why the last attempt ended, or why it is stalled
    attempt: int = 0  # attempts before the current one
    stalled: bool = False  # the last attempt stopped sending bytes (until new ones come)
    delay: float = 0.0  # in backoff: seconds from entering it to the next attempt
    result: Path | None = None
    waiters: dict[object, Waiter] = field(default_factory=dict)
    ladder: LadderDriver | None = None  # while stopping
    timer: Timer | None = None  # the stall watch while fetching, the retry in backoff
    gone: list[Callable[[], None]] = field(default_factory=list)  # run once the process exits

    @property
    def state(self) -> Fetch:
        return self.machine.state

    @property
    def key(self) -> tuple[str, str]:
        return self.ref.repo, self.ref.revision

    def retry_in(self, now: float) -> float | None:
        if self.state is not Fetch.BACKOFF:
            return None
        return max(0.0, self.machine.since + self.delay - now)

    def describe(self, now: float) -> str:
        """e.g. `downloading 1.2GiB of 4.5GiB (27%, 38MiB/s)`, `stalled: …; retry 2 in 8s`."""
        wait = self.retry_in(now)
        if wait is not None:
            return f"downloading: {self.error}; retry {self.attempt + 1} in {format_duration(wait)}"
        p = self.progress
        if p.total:
            verb = "verifying" if p.verifying else "downloading"
            text = progress_text(p.done, p.total, None if p.verifying else p.rate(), verb)
            if p.source and not p.verifying:
                text += f" from {p.source}"
        else:
            text = f"downloading ({p.text or 'starting'})"
        if self.stalled:
            text += f" ({self.error})"
        return text

    def event(self, now: float) -> cm.DownloadEvent:
        """Where it stands, for a client following a pull."""
        p, rate = self.progress, self.progress.rate()
        phase = "waiting" if self.retry_in(now) is not None else "starting" if not p.total \
            else "verifying" if p.verifying else "downloading"
        return cm.DownloadEvent(self.describe(now), phase, p.done, p.total,
                                round(rate) if rate is not None and not p.verifying else None)

    def status(self, now: float) -> cs.DownloadStatus:
        p, rate, wait = self.progress, self.progress.rate(), self.retry_in(now)
        return cs.DownloadStatus(
            repo=self.ref.repo, revision=self.ref.revision, pid=self.pid, done_bytes=p.done,
            total_bytes=p.total, bytes_per_s=round(rate) if rate is not None else None,
            verifying=p.verifying, stalled=self.stalled, attempt=self.attempt,
            error=self.error or None, retry_in_s=round(wait, 1) if wait is not None else None,
            source=p.source or None)


class Downloads:
    def __init__(self, seam: DownloadSeam, stall_after: float, stop: StopPolicy,
                 backoff: BackoffPolicy) -> None:
        self.seam = seam
        self.stall_after = stall_after
        self.stop_policy = stop
        self.backoff = backoff
        self.by_key: dict[tuple[str, str], Download] = {}
        self.by_pid: dict[int, Download] = {}

    def of(self, owner: object) -> Download | None:
        return next((d for d in self.by_key.values() if owner in d.waiters), None)

    def want(self, ref: HubRef, owner: object, on_done: Waiter,
             commit: str | None = None) -> Download:
        """Wait for `ref`'s files: joins the download in progress, else starts one."""
        d = self.by_key.get((ref.repo, ref.revision))
        if d is None:
            d = self.by_key[(ref.repo, ref.revision)] = Download(ref, commit,
                                                                 Backoff(self.backoff))
        d.waiters[owner] = on_done
        if d.state is Fetch.NEW:
            self._spawn(d)
        return d

    def leave(self, owner: object, then: Callable[[], None]) -> None:
        """`owner` no longer waits. The last one out stops the fetcher through the ladder;
        `then` runs once no process of this download is left on `owner`'s behalf."""
        d = self.of(owner)
        if d is None:
            then()
            return
        del d.waiters[owner]
        if d.waiters:
            then()  # the download goes on for the others
            return
        if d.pid is None:
            self._end(d, Fetch.DROPPED)
            then()
            return
        d.gone.append(then)
        self._stop(d, "nobody waits for it")

    def stop_all(self) -> None:
        for d in list(self.by_key.values()):
            d.waiters.clear()
            if d.pid is None:
                self._end(d, Fetch.DROPPED)
            else:
                self._stop(d, "exod is stopping")

    # ---- the process ---------------------------------------------------------------------
    def _move(self, d: Download, new: Fetch, reason: str = "") -> None:
        if d.timer is not None:  # each state's timer is its own
            d.timer.cancel()
            d.timer = None
        d.machine.move(new, self.seam.now(), reason)

    def _spawn(self, d: Download) -> None:
        d.stalled = False
        d.progress.restart(self.seam.now())
        try:
            pid = self.seam.spawn_fetcher(d)
        except OSError as e:
            self._finish(d, Outcome(None, f"cannot start the fetcher: {e}"))
            return
        self._move(d, Fetch.FETCHING)
        d.pid = pid
        self.by_pid[pid] = d
        logger.bind(event="download", repo=d.ref.repo, pid=pid).info(
            "fetching {} (attempt {})", d.ref, d.attempt + 1)
        self._watch_stall(d)
        self.seam.download_changed(d)

    def _watch_stall(self, d: Download) -> None:
        d.timer = self.seam.call_at(d.progress.last_bytes_at + self.stall_after,
                                    lambda: self._stall_due(d))

    def _stall_due(self, d: Download) -> None:
        d.timer = None
        if d.state is not Fetch.FETCHING:
            return
        now = self.seam.now()
        silent = now - d.progress.last_bytes_at
        if now < d.progress.last_bytes_at + self.stall_after:  # the deadline, not a rounding
            self._watch_stall(d)
            return
        d.stalled = True
        d.error = f"stalled: no bytes for {format_duration(silent)}"
        logger.bind(event="download", repo=d.ref.repo).warning("{}: {}; fetching again",
                                                                d.ref, d.error)
        self._stop(d, d.error)
        self.seam.download_changed(d)

    def _stop(self, d: Download, why: str) -> None:
        if d.state is not Fetch.FETCHING:
            return
        self._move(d, Fetch.STOPPING, why)
        d.ladder = LadderDriver(self.seam, self.stop_policy, lambda step: self._act(d, step, why))
        d.ladder.begin()

    def _act(self, d: Download, step: Step, why: str) -> None:
        """One rung of the ladder for the fetcher: it exits at the ask, its partial files kept."""
        if d.pid is None:
            return
        log = logger.bind(event="ladder", repo=d.ref.repo, pid=d.pid)
        if step is Step.ASK:
            log.info("stopping the fetcher of {} ({}): asking, grace {:g}s", d.ref, why,
                     self.stop_policy.grace)
            self.seam.ask(d.pid, 0.0)
            return
        log.bind(step=step.value).warning("fetcher of {}: {}", d.ref, step)
        self.seam.kill(d.pid, signal.SIGKILL if step is Step.KILL else signal.SIGTERM)

    # ---- events from the process table ---------------------------------------------------
    def on_message(self, pid: int, msg: m.FromFetcher) -> None:
        d = self.by_pid.get(pid)
        if d is None:
            return
        if isinstance(msg, m.DownloadProgress):
            if d.progress.update(msg, self.seam.now()):
                d.stalled = False
        elif isinstance(msg, m.Status):
            d.progress.text = clip(msg.text, 200)
        elif isinstance(msg, m.Failed):
            d.error = clip(msg.reason, 500)
        elif isinstance(msg, m.Fetched):
            d.result = Path(msg.path)
        self.seam.download_changed(d)

    def on_broken(self, pid: int, why: str) -> None:
        d = self.by_pid.get(pid)
        if d is not None:
            d.error = why
            self._stop(d, why)

    def on_exit(self, pid: int, info: ExitInfo) -> None:
        d = self.by_pid.pop(pid, None)
        if d is None:
            return
        d.pid = None
        if d.ladder is not None:
            d.ladder.reaped()
        stopped, d.ladder = d.state is Fetch.STOPPING, None
        gone, d.gone = d.gone, []
        for fn in gone:
            fn()
        log = logger.bind(event="download", repo=d.ref.repo, code=info.code)
        if d.result is not None and info.clean:
            log.info("fetched {} into {}", d.ref, d.result)
            self._finish(d, Outcome(d.result))
        elif not d.waiters:
            self._end(d, Fetch.DROPPED)
        elif not stopped and info.code in PERMANENT_EXIT_CODES:
            log.error("cannot fetch {}", d.error or f"{d.ref}: {info}")  # the error names it
            self._finish(d, Outcome(None, d.error or f"the fetcher exited: {info}"))
        else:
            d.error = d.error or f"the fetcher exited: {info}"
            self._retry(d)

    def _retry(self, d: Download) -> None:
        # Bytes that flowed for reset_after make this a new outage: the delays start over.
        d.backoff.settle(d.progress.flowing_since, d.progress.last_bytes_at)
        d.delay = d.backoff.next()
        d.attempt += 1
        self._move(d, Fetch.BACKOFF, d.error)
        logger.bind(event="download", repo=d.ref.repo).warning(
            "{}: {}; retrying in {}", d.ref, d.error, format_duration(d.delay))
        d.timer = self.seam.call_at(self.seam.now() + d.delay, lambda: self._retry_due(d))
        self.seam.download_changed(d)

    def _retry_due(self, d: Download) -> None:
        d.timer = None
        if d.state is Fetch.BACKOFF:
            self._spawn(d)

    def _finish(self, d: Download, outcome: Outcome) -> None:
        waiters = list(d.waiters.values())
        self._end(d, Fetch.FETCHED if outcome.path is not None else Fetch.FAILED,
                  outcome.error)
        for fn in waiters:
            fn(outcome)

    def _end(self, d: Download, final: Fetch, reason: str = "") -> None:
        self._move(d, final, reason)
        d.waiters.clear()
        if self.by_key.get(d.key) is d:
            del self.by_key[d.key]
