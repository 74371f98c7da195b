"""Downloads of hub models: one fetcher process per repository and revision, however many
instances (or `exoctl pull`s) wait for it, supervised like a runner.

A fetcher (`python -m exod.hub`) is spawned through the same process table as runners, says
hello on the same kind of channel, and is stopped through the same termination ladder (rung 1
asks it over its channel; it exits at once, and its partial files stay for the next attempt).
Nothing here times a download out: while bytes arrive it runs for as long as it takes. A fetcher
that sends no new byte for `hub.stall_after` is shown as stalled, stopped through the ladder and
started again with backoff; so is one that failed on the network once under way. Only a refusal
(not found, no access, offline and not cached, the hub unreachable with no download under way,
disk too small) ends a download with an error for its waiters.
Everything that touches the OS goes through `Seam`, so this runs in unit tests with a fake one.
"""

from __future__ import annotations

import collections
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from loguru import logger

from exod import control_messages as cm
from exod import messages as m
from exod.config.durations import format_duration
from exod.config.schema import BackoffPolicy, StopPolicy
from exod.core.exits import PERMANENT_EXIT_CODES, ExitInfo
from exod.core.ladder import LadderRun, Step
from exod.hub.files import progress_text
from exod.hub.ref import HubRef

RATE_WINDOW = 5.0  # seconds of samples the shown rate averages over


class Timer(Protocol):
    def cancel(self) -> None: ...


class Seam(Protocol):
    def now(self) -> float: ...

    def call_at(self, when: float, fn: Callable[[], None]) -> Timer: ...

    def spawn_fetcher(self, d: Download) -> int:
        """Start `python -m exod.hub` for `d`; its pid. Raises OSError when exec fails."""
        ...

    def ask(self, pid: int, drain: float) -> bool: ...

    def kill(self, pid: int, sig: int) -> bool: ...

    def download_changed(self, d: Download) -> None: ...


@dataclass(frozen=True)
class Outcome:
    path: Path | None  # the snapshot, when fetched
    error: str = ""


Waiter = Callable[[Outcome], None]


@dataclass
class Download:
    ref: HubRef
    commit: str | None  # the cache's commit for the revision: fetched as is, never looked up
    pid: int | None = None
    done: int = 0
    total: int = 0
    verifying: bool = False
    text: str = ""  # what the fetcher last said it does
    error: str = ""  # why the last attempt ended, or why it is stalled
    attempt: int = 0
    stalled: bool = False
    retry_at: float | None = None
    last_bytes_at: float = 0.0
    result: Path | None = None
    waiters: dict[object, Waiter] = field(default_factory=dict)
    ladder: LadderRun | None = None
    samples: collections.deque[tuple[float, int]] = field(default_factory=collections.deque)
    timers: dict[str, Timer] = field(default_factory=dict)
    gone: list[Callable[[], None]] = field(default_factory=list)  # run once the process exits

    @property
    def key(self) -> tuple[str, str]:
        return self.ref.repo, self.ref.revision

    def rate(self) -> float | None:
        """Bytes per second over the last few seconds of samples."""
        if len(self.samples) < 2:
            return None
        (t0, b0), (t1, b1) = self.samples[0], self.samples[-1]
        return (b1 - b0) / (t1 - t0) if t1 > t0 else None

    def describe(self, now: float) -> str:
        """e.g. `downloading 1.2GiB of 4.5GiB (27%, 38MiB/s)`, `stalled: …; retry 2 in 8s`."""
        if self.retry_at is not None:
            wait = format_duration(max(0.0, self.retry_at - now))
            return f"downloading: {self.error}; retry {self.attempt + 1} in {wait}"
        if self.total:
            verb = "verifying" if self.verifying else "downloading"
            text = progress_text(self.done, self.total, None if self.verifying else self.rate(),
                                 verb)
        else:
            text = f"downloading ({self.text or 'starting'})"
        if self.stalled:
            text += f" ({self.error})"
        return text

    def status(self, now: float) -> cm.DownloadStatus:
        rate = self.rate()
        return cm.DownloadStatus(
            repo=self.ref.repo, revision=self.ref.revision, pid=self.pid, done_bytes=self.done,
            total_bytes=self.total, bytes_per_s=round(rate) if rate is not None else None,
            verifying=self.verifying, stalled=self.stalled, attempt=self.attempt,
            error=self.error or None,
            retry_in_s=round(max(0.0, self.retry_at - now), 1)
            if self.retry_at is not None else None)


class Downloads:
    def __init__(self, seam: Seam, stall_after: float, stop: StopPolicy,
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
            d = self.by_key[(ref.repo, ref.revision)] = Download(ref, commit)
        d.waiters[owner] = on_done
        if d.pid is None and d.retry_at is None:
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
            self._forget(d)
            then()
            return
        d.gone.append(then)
        self._stop(d, "nobody waits for it")

    def stop_all(self) -> None:
        for d in list(self.by_key.values()):
            d.waiters.clear()
            if d.pid is None:
                self._forget(d)
            else:
                self._stop(d, "exod is stopping")

    # ---- the process ---------------------------------------------------------------------
    def _spawn(self, d: Download) -> None:
        d.retry_at, d.stalled, d.verifying = None, False, False
        d.samples.clear()
        d.last_bytes_at = self.seam.now()
        try:
            d.pid = self.seam.spawn_fetcher(d)
        except OSError as e:
            self._finish(d, Outcome(None, f"cannot start the fetcher: {e}"))
            return
        self.by_pid[d.pid] = d
        logger.bind(event="download", repo=d.ref.repo, pid=d.pid).info(
            "fetching {} (attempt {})", d.ref, d.attempt + 1)
        self._watch_stall(d)
        self.seam.download_changed(d)

    def _watch_stall(self, d: Download) -> None:
        self._timer(d, "stall", d.last_bytes_at + self.stall_after, lambda: self._stall_due(d))

    def _stall_due(self, d: Download) -> None:
        d.timers.pop("stall", None)
        if d.pid is None or d.ladder is not None:
            return
        silent = self.seam.now() - d.last_bytes_at
        if silent < self.stall_after:
            self._watch_stall(d)
            return
        d.stalled = True
        d.error = f"stalled: no bytes for {format_duration(silent)}"
        logger.bind(event="download", repo=d.ref.repo).warning("{}: {}; fetching again",
                                                                d.ref, d.error)
        self._stop(d, d.error)
        self.seam.download_changed(d)

    def _stop(self, d: Download, why: str) -> None:
        if d.ladder is not None or d.pid is None:
            return
        d.ladder = LadderRun(self.stop_policy, self.seam.now())
        logger.bind(event="ladder", repo=d.ref.repo, pid=d.pid).info(
            "stopping the fetcher of {} ({}): asking, grace {:g}s", d.ref, why,
            self.stop_policy.grace)
        self.seam.ask(d.pid, 0.0)
        self._timer(d, "ladder", d.ladder.deadline, lambda: self._ladder_tick(d))

    def _ladder_tick(self, d: Download) -> None:
        d.timers.pop("ladder", None)
        if d.ladder is None or d.pid is None:
            return
        step = d.ladder.due(self.seam.now())
        if step is not None:
            logger.bind(event="ladder", repo=d.ref.repo, pid=d.pid, step=step.value).warning(
                "fetcher of {}: {}", d.ref, step)
            self.seam.kill(d.pid, signal.SIGKILL if step is Step.KILL else signal.SIGTERM)
        self._timer(d, "ladder", d.ladder.deadline, lambda: self._ladder_tick(d))

    def _timer(self, d: Download, name: str, when: float, fn: Callable[[], None]) -> None:
        old = d.timers.pop(name, None)
        if old is not None:
            old.cancel()
        d.timers[name] = self.seam.call_at(when, fn)

    # ---- events from the process table ---------------------------------------------------
    def on_message(self, pid: int, msg: m.FromRunner) -> None:
        d = self.by_pid.get(pid)
        if d is None:
            return
        now = self.seam.now()
        if isinstance(msg, m.Download):
            if msg.done != d.done or msg.verifying != d.verifying or msg.total != d.total:
                d.last_bytes_at = now
                d.stalled = False
            if msg.verifying != d.verifying:
                d.samples.clear()
            d.done, d.total, d.verifying = msg.done, msg.total, msg.verifying
            d.samples.append((now, msg.done))
            while len(d.samples) > 2 and now - d.samples[0][0] > RATE_WINDOW:
                d.samples.popleft()
        elif isinstance(msg, m.Status):
            d.text = msg.text[:200]
        elif isinstance(msg, m.Failed):
            d.error = msg.reason[:500]
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
        for name in ("ladder", "stall"):
            timer = d.timers.pop(name, None)
            if timer is not None:
                timer.cancel()
        stopped, d.ladder = d.ladder is not None, None
        gone, d.gone = d.gone, []
        for fn in gone:
            fn()
        log = logger.bind(event="download", repo=d.ref.repo, code=info.code)
        if d.result is not None and info.clean:
            log.info("fetched {} into {}", d.ref, d.result)
            self._finish(d, Outcome(d.result))
        elif not d.waiters:
            self._forget(d)
        elif not stopped and info.code in PERMANENT_EXIT_CODES:
            log.error("cannot fetch {}", d.error or f"{d.ref}: {info}")  # the error names it
            self._finish(d, Outcome(None, d.error or f"the fetcher exited: {info}"))
        else:
            d.error = d.error or f"the fetcher exited: {info}"
            self._retry(d)

    def _retry(self, d: Download) -> None:
        b = self.backoff
        delay = min(b.max, b.initial * b.multiplier ** d.attempt)
        d.attempt += 1
        d.retry_at = self.seam.now() + delay
        logger.bind(event="download", repo=d.ref.repo).warning(
            "{}: {}; retrying in {}", d.ref, d.error, format_duration(delay))
        self._timer(d, "retry", d.retry_at, lambda: self._retry_due(d))
        self.seam.download_changed(d)

    def _retry_due(self, d: Download) -> None:
        d.timers.pop("retry", None)
        if d.waiters and self.by_key.get(d.key) is d:
            self._spawn(d)

    def _finish(self, d: Download, outcome: Outcome) -> None:
        waiters = list(d.waiters.values())
        self._forget(d)
        for fn in waiters:
            fn(outcome)

    def _forget(self, d: Download) -> None:
        for timer in d.timers.values():
            timer.cancel()
        d.timers.clear()
        d.waiters.clear()
        if self.by_key.get(d.key) is d:
            del self.by_key[d.key]
