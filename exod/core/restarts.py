"""Restart policy: exponential backoff on the monotonic clock, and a start limit. Pure."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

from exod.config.schema import BackoffPolicy, RestartMode, StartLimit
from exod.core.exits import ExitInfo


@dataclass(frozen=True)
class Restart:
    delay: float


@dataclass(frozen=True)
class GiveUp:
    reason: str


@dataclass(frozen=True)
class Rest:
    """Exited in a way the policy does not restart (e.g. clean exit with on-failure)."""

    reason: str


Decision = Restart | GiveUp | Rest


class RestartTracker:
    """Decides what follows an unexpected exit. One per instance; survives restarts."""

    def __init__(
        self,
        mode: RestartMode,
        backoff: BackoffPolicy,
        limit: StartLimit,
        rng: random.Random | None = None,
    ) -> None:
        self.mode = mode
        self.backoff = backoff
        self.limit = limit
        self._rng = rng or random.Random()
        self._failures: deque[float] = deque()
        self._attempt = 0
        self._ready_at: float | None = None
        self.restarts = 0  # shown in status: how many automatic restarts happened

    def reset(self) -> None:
        """An operator's explicit start: forget past failures (as `systemctl reset-failed`)."""
        self._failures.clear()
        self._attempt = 0
        self._ready_at = None

    def on_ready(self, now: float) -> None:
        self._ready_at = now

    def on_exit(self, now: float, info: ExitInfo, reason: str = "",
                counts: bool = True) -> Decision:
        """An exit nobody asked for. `reason` is the runner's own account, if it sent one.
        `counts=False`: the host, not the runner, failed (no file descriptors or memory to
        start it): back off as usual, but the start limit does not count it, so a flood of
        connections cannot put an instance in `failed`."""
        ran_stably = self._ready_at is not None and now - self._ready_at >= self.backoff.reset_after
        self._ready_at = None
        if ran_stably:
            self._attempt = 0
            self._failures.clear()
        what = f"{info}: {reason}" if reason else str(info)
        if info.permanent:
            return GiveUp(what)
        if self.mode == "no" or (self.mode == "on-failure" and info.clean):
            return Rest(what) if info.clean else GiveUp(what)
        if counts:
            self._failures.append(now)
        while self._failures and now - self._failures[0] > self.limit.interval:
            self._failures.popleft()
        if len(self._failures) >= self.limit.burst:
            return GiveUp(
                f"{what}; start limit hit ({len(self._failures)} failures in "
                f"{self.limit.interval:g}s)"
            )
        delay = self.delay(self._attempt)
        self._attempt += 1
        self.restarts += 1
        return Restart(delay)

    def delay(self, attempt: int) -> float:
        b = self.backoff
        try:
            base = min(b.max, b.initial * b.multiplier**attempt)
        except OverflowError:  # a crash loop slow enough to dodge the start limit, for days
            base = b.max
        spread = base * b.jitter
        return max(0.0, min(b.max, base + self._rng.uniform(-spread, spread)))
