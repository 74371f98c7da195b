"""Tokens per minute as a token bucket: full at the limit, refilled at limit/60 a second, and
spent by what requests use. Tokens are counted as the runner reports them, after the request
was let in, so a bucket can go below zero: the next request waits until it holds a token
again. A stream under way is never cut; it only spends."""

from __future__ import annotations

import math
from dataclasses import dataclass

MINUTE = 60.0


@dataclass
class TokenBucket:
    limit: int  # tokens a minute, and what the bucket holds when full
    level: float
    at: float  # monotonic seconds of `level`

    @classmethod
    def full(cls, limit: int, now: float) -> TokenBucket:
        return cls(limit, float(limit), now)

    def _refill(self, now: float) -> None:
        if now > self.at:
            self.level = min(float(self.limit), self.level + (now - self.at) * self.rate)
            self.at = now

    @property
    def rate(self) -> float:
        return self.limit / MINUTE

    def resize(self, limit: int, now: float) -> None:
        """A reload changed the limit: what was spent stays spent."""
        self._refill(now)
        if limit != self.limit:
            self.level = min(float(limit), self.level + (limit - self.limit))
            self.limit = limit

    def spend(self, tokens: int, now: float) -> None:
        self._refill(now)
        self.level -= tokens

    def allows(self, now: float) -> bool:
        """A token is left: a new request may start."""
        self._refill(now)
        return self.level >= 1.0

    def remaining(self, now: float) -> int:
        self._refill(now)
        return max(0, math.floor(self.level))

    def wait(self, now: float) -> float:
        """Seconds until a new request may start (0: now)."""
        self._refill(now)
        return 0.0 if self.level >= 1.0 else (1.0 - self.level) / self.rate

    def until_full(self, now: float) -> float:
        self._refill(now)
        return (self.limit - self.level) / self.rate
