"""Durations (`500ms`, `10s`, `2m`, `1h`, `1m30s`, or a number of seconds) to seconds, and back.

One grammar for exod's config and for the systemd time spans it reads from unit files
(systemd.time(7): `1min 30s`, `2 hours`, `infinity`): systemd's unit names are a superset of
the short ones, and parts may be separated by spaces.
"""

from __future__ import annotations

import math
import re

from exod.core.text import clip

_UNITS = {
    "usec": 1e-6, "us": 1e-6, "µs": 1e-6,
    "msec": 1e-3, "ms": 1e-3,
    "seconds": 1.0, "second": 1.0, "sec": 1.0, "s": 1.0,
    "minutes": 60.0, "minute": 60.0, "min": 60.0, "m": 60.0,
    "hours": 3600.0, "hour": 3600.0, "hr": 3600.0, "h": 3600.0,
    "days": 86400.0, "day": 86400.0, "d": 86400.0,
    "weeks": 604800.0, "week": 604800.0, "w": 604800.0,
    "months": 2629800.0, "month": 2629800.0, "M": 2629800.0,
    "years": 31557600.0, "year": 31557600.0, "y": 31557600.0,
}
# The longest unit name that follows the number wins ("5ms" is milliseconds, never minutes).
_PART = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(" +
                   "|".join(sorted(map(re.escape, _UNITS), key=len, reverse=True)) + r")\s*")
_NUMBER = re.compile(r"[+-]?(\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")

HINT = "use e.g. 500ms, 10s, 2m, 1h or a number of seconds"


def parse_duration(value: object) -> float:
    """Seconds as a float. Raises ValueError (with an operator-facing message) on anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        # ValueError, not TypeError: every bad input is the operator's, and reported alike.
        raise ValueError(f"bad duration {value!r}: {HINT}")  # noqa: TRY004
    if isinstance(value, str):
        seconds = _parse_text(value)
    else:
        try:
            seconds = float(value)
        except OverflowError:
            raise ValueError("bad duration: too large") from None
    if math.isnan(seconds):
        raise ValueError(f"bad duration {value!r}: {HINT}")
    if seconds < 0:
        raise ValueError(f"bad duration {_show(value)}: must not be negative")
    if math.isinf(seconds):
        raise ValueError(f"bad duration {_show(value)}: too large")
    return seconds


def parse_signed(text: str) -> float:
    """Seconds of a duration that may be negative (`-1`, `-5m`); raises ValueError."""
    return _parse_text(text)


def _parse_text(text: str) -> float:
    s = text.strip()
    if _NUMBER.fullmatch(s):
        return float(s)
    negative = s.startswith("-")
    body = s[1:] if negative else s
    total, pos = 0.0, 0
    for m in _PART.finditer(body):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos == 0 or pos != len(body):
        raise ValueError(f"bad duration {_show(text)}: {HINT}")
    return -total if negative else total


def parse_timespan(text: str) -> float:
    """A systemd time span from a unit file: seconds, math.inf for `infinity`."""
    if text.strip() == "infinity":
        return math.inf
    seconds = _parse_text(text)
    if seconds < 0:
        raise ValueError(f"bad time span {_show(text)}: must not be negative")
    return seconds


def _show(value: object) -> str:
    return clip(repr(value) if isinstance(value, str) else str(value), 40)


def format_duration(seconds: float) -> str:
    """Short human form for status lines: `500ms`, `2.5s`, `25s`, `1m30s`, `4m`, `1h5m`, `2d3h`.

    At most two units, so a long uptime stays short; the second unit is dropped when zero.
    """
    if math.isnan(seconds):
        return "?"
    if seconds < 0:
        return "-" + format_duration(-seconds)
    if math.isinf(seconds):
        return "∞"
    if seconds == 0:
        return "0s"
    if seconds < 1:
        ms = round(seconds * 1000)
        return f"{ms}ms" if ms < 1000 else "1s"
    if seconds < 10 and round(seconds, 1) != round(seconds):
        return f"{round(seconds, 1):g}s"
    whole = round(seconds)
    for big, big_name, small, small_name in (
        (86400, "d", 3600, "h"),
        (3600, "h", 60, "m"),
        (60, "m", 1, "s"),
    ):
        if whole >= big:
            major, rest = divmod(whole, big)
            minor = rest // small
            return f"{major}{big_name}{minor}{small_name}" if minor else f"{major}{big_name}"
    return f"{whole}s"
