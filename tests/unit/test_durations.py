from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exod.core.durations import format_duration, parse_duration


@pytest.mark.parametrize("value, seconds", [
    (0, 0.0), (10, 10.0), (1.5, 1.5), ("30", 30.0), ("1.5", 1.5), (" 10s ", 10.0),
    ("500ms", 0.5), ("10s", 10.0), ("1.5s", 1.5), ("2m", 120.0), ("1h", 3600.0), ("1d", 86400.0),
    ("1m30s", 90.0), ("1h2m3s", 3723.0), ("2m500ms", 120.5), (".5s", 0.5), ("5ms", 0.005),
    ("1e3", 1000.0),
    # One grammar with systemd.time(7), which exod also reads from unit files:
    ("10 s", 10.0), ("1min 30s", 90.0), ("2 hours", 7200.0), ("100us", 1e-4),
])
def test_parse_good(value: object, seconds: float) -> None:
    assert parse_duration(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value, fragment", [
    ("abc", "bad duration 'abc': use e.g. 500ms, 10s, 2m, 1h or a number of seconds"),
    ("", "bad duration ''"),
    ("10S", "bad duration '10S'"),
    ("1m30", "bad duration '1m30'"),
    ("s", "bad duration 's'"),
    ("inf", "bad duration 'inf'"),
    ("nan", "bad duration 'nan'"),
    (-1, "bad duration -1: must not be negative"),
    (-0.5, "must not be negative"),
    ("-5s", "bad duration '-5s': must not be negative"),
    ("-30", "must not be negative"),
    (True, "bad duration True"),
    (None, "bad duration None"),
    ([1], "bad duration [1]"),
    (float("nan"), "bad duration nan"),
    (float("inf"), "too large"),
    ("1e999", "too large"),
    (10 ** 400, "too large"),
])
def test_parse_bad(value: object, fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_duration(value)
    assert fragment in str(info.value)


@pytest.mark.parametrize("seconds, text", [
    (0, "0s"), (0.25, "250ms"), (0.9999, "1s"), (1, "1s"), (2.5, "2.5s"), (25, "25s"),
    (25.4, "25s"), (59.6, "1m"), (90, "1m30s"), (240, "4m"), (3600, "1h"), (3725, "1h2m"),
    (86400 * 2 + 3600 * 3, "2d3h"), (-5, "-5s"),
])
def test_format(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@given(st.floats(min_value=0, max_value=10 * 86400, allow_nan=False))
def test_format_reads_back_close(seconds: float) -> None:
    """What a status line shows is itself a valid duration, within the precision shown."""
    back = parse_duration(format_duration(seconds))
    if seconds < 10:
        assert back == pytest.approx(seconds, abs=0.051)
    else:
        # at most two units are shown, so the error is below one of the smaller unit
        assert abs(back - seconds) < max(1.0, seconds / 24) or math.isclose(back, seconds)
