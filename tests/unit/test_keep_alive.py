"""A request's keep_alive as Ollama's clients send it (exod.core.keep_alive); the daemon's side
(the idle window it sets, within the instance's bounds) is in test_traffic."""

from __future__ import annotations

import math
from typing import Any

import pytest

from exod.config.schema import KeepAliveBounds
from exod.core.keep_alive import bounded, parse
from exod.core.request_rules import RequestError


@pytest.mark.parametrize("raw, seconds", [
    (None, None), ("5m", 300), ("1h30m", 5400), ("300ms", 0.3), ("1.5h", 5400), (" 10s ", 10),
    (300, 300), (2.5, 2.5), (0, 0), ("0", 0), (-1, math.inf), ("-1", math.inf),
    ("-5m", math.inf)])
def test_durations_seconds_zero_and_negative(raw: Any, seconds: float | None) -> None:
    assert parse(raw) == seconds


@pytest.mark.parametrize("raw", [True, [], {}, "soon", "5 parsecs", "nan", float("nan")])
def test_anything_else_is_refused_by_name(raw: Any) -> None:
    with pytest.raises(RequestError) as e:
        parse(raw)
    assert e.value.param == "keep_alive" and "`keep_alive`" in str(e.value)


def test_the_operators_bounds_win() -> None:
    bounds = KeepAliveBounds(min=60, max=3600)
    assert [bounded(s, bounds) for s in (0, 30, 600, math.inf)] == [60, 60, 600, 3600]
    assert bounded(0, KeepAliveBounds()) == 0 and bounded(math.inf, KeepAliveBounds()) == math.inf
