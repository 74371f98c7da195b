"""systemd time spans (systemd.time(7)): `45s`, `1min 30s`, `2h`, `500ms`, `infinity`, `90`."""

from __future__ import annotations

import math
import re

UNITS = {
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
_PART = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-zµ]*)")


def parse_timespan(text: str, default_unit: float = 1.0) -> float:
    """Seconds; math.inf for `infinity`. Raises ValueError. A bare number uses `default_unit`
    (seconds for TimeoutStopSec= and friends)."""
    t = text.strip()
    if t == "infinity":
        return math.inf
    if not t:
        raise ValueError("empty time span")
    total, pos = 0.0, 0
    while pos < len(t):
        m = _PART.match(t, pos)
        if not m or m.end() == pos:
            raise ValueError(f"bad time span {text!r}")
        number, unit = float(m.group(1)), m.group(2)
        if unit and unit not in UNITS:
            raise ValueError(f"bad time unit {unit!r} in {text!r}")
        total += number * (UNITS[unit] if unit else default_unit)
        pos = m.end()
        while pos < len(t) and t[pos].isspace():
            pos += 1
    return total
