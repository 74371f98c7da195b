"""Tokens each key used in the current UTC day and month (exod.core.usage.calendar): only the
newest window of each period is kept, so a record of an older day adds to nothing."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from exod.core.usage.calendar import PERIODS, Period, window


@dataclass
class Quotas:
    # (key, period) → (window, tokens used in it)
    used_in: dict[tuple[str, Period], tuple[str, int]] = field(default_factory=dict)

    def add(self, key: str, tokens: int, wall: float) -> None:
        for period in PERIODS:
            self.add_to(key, period, window(period, wall), tokens)

    def add_to(self, key: str, period: Period, win: str, tokens: int) -> None:
        had, n = self.used_in.get((key, period), ("", 0))
        if win == had:
            self.used_in[key, period] = (win, n + tokens)
        elif win > had:
            self.used_in[key, period] = (win, tokens)

    def used(self, key: str, period: Period, wall: float) -> int:
        had, n = self.used_in.get((key, period), ("", 0))
        return n if had == window(period, wall) else 0

    def merge(self, other: Quotas) -> None:
        for (key, period), (win, n) in other.used_in.items():
            self.add_to(key, period, win, n)

    def entries(self) -> Iterator[tuple[str, Period, str, int]]:
        for (key, period), (win, n) in sorted(self.used_in.items()):
            yield key, period, win, n
