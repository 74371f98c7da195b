"""Quota windows: the UTC calendar day and month a moment falls in, and when each ends."""

from __future__ import annotations

import datetime as dt
from typing import Literal

Period = Literal["day", "month"]
PERIODS: tuple[Period, ...] = ("day", "month")
UTC = dt.timezone.utc


def window(period: Period, wall: float) -> str:
    """The window `wall` (epoch seconds) falls in: `2025-06-01` (a day), `2025-06` (a month).
    Strings that sort as time does."""
    t = dt.datetime.fromtimestamp(wall, UTC)
    return t.strftime("%Y-%m-%d" if period == "day" else "%Y-%m")


def window_end(period: Period, wall: float) -> float:
    """Epoch seconds at which the window `wall` falls in ends (the next one starts)."""
    t = dt.datetime.fromtimestamp(wall, UTC)
    if period == "day":
        start = dt.datetime(t.year, t.month, t.day, tzinfo=UTC)
        return (start + dt.timedelta(days=1)).timestamp()
    year, month = (t.year + 1, 1) if t.month == 12 else (t.year, t.month + 1)
    return dt.datetime(year, month, 1, tzinfo=UTC).timestamp()


def iso(wall: float) -> str:
    """`2025-06-01T00:00:00Z`: how the API and the logs write a moment."""
    t = dt.datetime.fromtimestamp(wall, UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S") + (f".{t.microsecond // 1000:03d}Z"
                                               if t.microsecond else "Z")


def parse_iso(text: str) -> float:
    """The inverse of `iso` (any ISO 8601 moment with its offset); raises ValueError."""
    t = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if t.tzinfo is None:
        raise ValueError(f"{text!r} has no time zone")
    return t.timestamp()
