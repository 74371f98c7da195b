"""The one check of a request against its key's limits (exod.core.keys.KeyLimits), and what
the key's requests spend. A request is let in or refused once, when it arrives; what it uses
is counted as the runner reports it (prompt tokens once the runner has read the prompt,
completion tokens as they come), so a request under way is never cut by a limit: it spends,
and the key's next request is refused until the limit allows it again."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from exod.core.keys import ApiKey
from exod.core.usage.bucket import TokenBucket
from exod.core.usage.calendar import Period, window_end
from exod.core.usage.quota import Quotas
from exod.core.usage.recent import Recent

LimitName = Literal["in_flight", "prompt_tokens_per_minute", "completion_tokens_per_minute",
                    "tokens_per_day", "tokens_per_month"]
Kind = Literal["prompt", "completion"]
IN_FLIGHT_RETRY = 1.0  # seconds: a request of the key may end at any moment


@dataclass(frozen=True)
class TokenWindow:
    """A per-minute bucket as the answer's headers tell it."""

    limit: int
    remaining: int
    reset_after: float  # seconds until the bucket is full again


class Limited(Exception):
    """`key` may not start a request now: `what` is at `limit`. `retry_after`: seconds until
    it may; `resets_at`: a quota's window end (epoch seconds); `tokens`: its per-minute
    buckets, by kind."""

    def __init__(self, key: str, what: LimitName, limit: int, retry_after: float,
                 resets_at: float | None = None, used: int = 0,
                 tokens: dict[Kind, TokenWindow] | None = None) -> None:
        super().__init__(f"{key}: {what} {limit}")
        self.key, self.what, self.limit = key, what, limit
        self.retry_after, self.resets_at, self.used = retry_after, resets_at, used
        self.tokens = tokens or {}


@dataclass
class KeyState:
    in_flight: int = 0
    buckets: dict[Kind, TokenBucket] = field(default_factory=dict)
    recent: Recent = field(default_factory=Recent)


@dataclass(frozen=True)
class KeyLoad:
    """A key's load, for the status page."""

    key: str
    in_flight: int
    recent_tokens: int  # prompt and completion, over exod.core.usage.recent.SPAN


class KeyGate:
    def __init__(self, quotas: Quotas | None = None) -> None:
        self.keys: dict[str, KeyState] = {}
        self.quotas = quotas if quotas is not None else Quotas()

    def admit(self, key: ApiKey, now: float, wall: float) -> None:
        """Let a request of `key` in (it is in flight until `leave`), or raise Limited.
        `now`: monotonic seconds; `wall`: epoch seconds (the quotas' calendar)."""
        state = self.keys.setdefault(key.name, KeyState())
        lim = key.limits
        for period, quota in (("day", lim.tokens_per_day), ("month", lim.tokens_per_month)):
            self._quota(key.name, period, quota, wall)  # type: ignore[arg-type]
        if lim.in_flight is not None and state.in_flight >= lim.in_flight:
            raise Limited(key.name, "in_flight", lim.in_flight, IN_FLIGHT_RETRY)
        windows = self.windows(key, now)
        for kind, bucket in state.buckets.items():
            if not bucket.allows(now):
                what: LimitName = f"{kind}_tokens_per_minute"  # type: ignore[assignment]
                raise Limited(key.name, what, bucket.limit, bucket.wait(now), tokens=windows)
        state.in_flight += 1

    def _quota(self, name: str, period: Period, quota: int | None, wall: float) -> None:
        if quota is None:
            return
        used = self.quotas.used(name, period, wall)
        if used >= quota:
            end = window_end(period, wall)
            what: LimitName = f"tokens_per_{period}"  # type: ignore[assignment]
            raise Limited(name, what, quota, end - wall, resets_at=end, used=used)

    def leave(self, name: str) -> None:
        state = self.keys.get(name)
        if state is not None and state.in_flight > 0:
            state.in_flight -= 1

    def spend(self, key: ApiKey, kind: Kind, tokens: int, now: float, wall: float) -> None:
        """`key`'s request used `tokens` more of `kind` (counted against every limit)."""
        if tokens <= 0:
            return
        state = self.keys.setdefault(key.name, KeyState())
        self._buckets(key, state, now)
        bucket = state.buckets.get(kind)
        if bucket is not None:
            bucket.spend(tokens, now)
        state.recent.add(tokens, now)
        self.quotas.add(key.name, tokens, wall)

    def windows(self, key: ApiKey, now: float) -> dict[Kind, TokenWindow]:
        """The key's per-minute buckets (those it has a limit for), for the headers."""
        state = self.keys.setdefault(key.name, KeyState())
        self._buckets(key, state, now)
        return {kind: TokenWindow(b.limit, b.remaining(now), b.until_full(now))
                for kind, b in state.buckets.items()}

    def _buckets(self, key: ApiKey, state: KeyState, now: float) -> None:
        """The key's buckets as its limits say now (a reload may have changed them)."""
        limits: dict[Kind, int | None] = {
            "prompt": key.limits.prompt_tokens_per_minute,
            "completion": key.limits.completion_tokens_per_minute}
        for kind, limit in limits.items():
            bucket = state.buckets.get(kind)
            if limit is None:
                state.buckets.pop(kind, None)
            elif bucket is None:
                state.buckets[kind] = TokenBucket.full(limit, now)
            else:
                bucket.resize(limit, now)

    def load(self, now: float) -> list[KeyLoad]:
        """Every key with a request in flight or tokens in the last minutes, busiest first."""
        loads = [KeyLoad(name, s.in_flight, s.recent.total(now))
                 for name, s in self.keys.items()]
        loads = [x for x in loads if x.in_flight or x.recent_tokens]
        return sorted(loads, key=lambda x: (-x.in_flight, -x.recent_tokens, x.key))
