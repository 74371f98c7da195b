"""Restart policy: exponential backoff on the monotonic clock, and a start limit. Pure.

`Backoff` is the one backoff of exod: runners' restarts (through `RestartTracker`) and
downloads' retries (exod.daemon.downloads) both wait by it.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass
from typing import Literal, Protocol

from exod.core.exits import ExitInfo

RestartMode = Literal["no", "on-failure", "always"]


# The same name as exod.config.schema.BackoffPolicy, which it describes: core imports no config.
class BackoffPolicy(Protocol):
    """What a backoff reads of its policy (the config's `backoff`); durations in seconds."""

    @property
    def initial(self) -> float: ...

    @property
    def multiplier(self) -> float: ...

    @property
    def max(self) -> float: ...

    @property
    def jitter(self) -> float: ...

    @property
    def reset_after(self) -> float: ...


# The same name as exod.config.schema.StartLimit, which it describes: core imports no config.
class StartLimit(Protocol):
    """At most `burst` failed starts within `interval` seconds (the config's `start_limit`)."""

    @property
    def burst(self) -> int: ...

    @property
    def interval(self) -> float: ...


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


class Backoff:
    """Exponential delays, capped, with jitter; a run that went well for `reset_after` starts
    them over (`settle`)."""

    def __init__(self, policy: BackoffPolicy, rng: random.Random | None = None) -> None:
        self.policy = policy
        self._rng = rng or random.Random()
        self.attempt = 0  # delays taken since the last reset

    def next(self) -> float:
        """The delay before the next attempt."""
        delay = self.delay(self.attempt)
        self.attempt += 1
        return delay

    def settle(self, since: float | None, until: float) -> bool:
        """The run that ended went well from `since` to `until` (None: not at all): when that
        is `reset_after` or more, the next delay is the first again. Says whether it was."""
        stable = since is not None and until - since >= self.policy.reset_after
        if stable:
            self.attempt = 0
        return stable

    def reset(self) -> None:
        self.attempt = 0

    def delay(self, attempt: int) -> float:
        b = self.policy
        try:
            base = min(b.max, b.initial * b.multiplier**attempt)
        except OverflowError:  # a crash loop slow enough to dodge the start limit, for days
            base = b.max
        spread = base * b.jitter
        return max(0.0, min(b.max, base + self._rng.uniform(-spread, spread)))


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
        self.limit = limit
        self.backoff = Backoff(backoff, rng)
        self._failures: deque[float] = deque()
        self._ready_at: float | None = None
        self.restarts = 0  # shown in status: how many automatic restarts happened

    def reset(self) -> None:
        """An operator's explicit start: forget past failures (as `systemctl reset-failed`)."""
        self._failures.clear()
        self.backoff.reset()
        self._ready_at = None

    def on_ready(self, now: float) -> None:
        self._ready_at = now

    def on_exit(self, now: float, info: ExitInfo, reason: str = "",
                counts: bool = True) -> Decision:
        """An exit nobody asked for. `reason` is the runner's own account, if it sent one.
        `counts=False`: the host, not the runner, failed (no file descriptors or memory to
        start it): back off as usual, but the start limit does not count it, so a flood of
        connections cannot put an instance in `failed`."""
        if self.backoff.settle(self._ready_at, now):  # it stayed ready for reset_after
            self._failures.clear()
        self._ready_at = None
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
        self.restarts += 1
        return Restart(self.backoff.next())

    def delay(self, attempt: int) -> float:
        return self.backoff.delay(attempt)
