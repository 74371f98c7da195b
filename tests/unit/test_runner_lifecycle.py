"""The runner's interruptible waits (exod.runner.link.lifecycle): pure Python, no mlx. Timers and
the process exit are replaced by recorders, so the test fires each grace timer itself."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from exod.runner.link import lifecycle
from exod.runner.link.lifecycle import Lifecycle


@pytest.fixture
def timers(monkeypatch: pytest.MonkeyPatch) -> list[Callable[[], None]]:
    made: list[Callable[[], None]] = []

    class RecordedTimer:
        def __init__(self, interval: float, fn: Callable[[], None]) -> None:
            made.append(fn)

        def start(self) -> None:
            pass

    monkeypatch.setattr(lifecycle.threading, "Timer", RecordedTimer)
    return made


@pytest.fixture
def exits(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    codes: list[int] = []
    monkeypatch.setattr(lifecycle.os, "_exit", codes.append)
    return codes


def test_a_stop_ends_a_wait_after_its_grace(timers: list[Callable[[], None]],
                                            exits: list[int]) -> None:
    life = Lifecycle(None)
    with life.interruptible(grace=2.0):
        life.request_stop("asked by exod")
        assert exits == [] and len(timers) == 1
        timers[0]()
    assert exits == [0]


def test_a_stale_grace_does_not_end_a_later_wait(timers: list[Callable[[], None]],
                                                 exits: list[int]) -> None:
    """While stopping, a worker still follows rank 0's headers (the drain): the grace of a
    wait that already ended (its header came) must not end the next wait."""
    life = Lifecycle(None)
    life.request_stop("asked by exod")
    with life.interruptible(grace=2.0):
        pass  # the next header came at once
    (stale,) = timers
    with life.interruptible(grace=2.0):
        stale()
        assert exits == []
        timers[-1]()  # this wait's own grace
    assert exits == [0]
    stale()
    assert exits == [0]  # outside any wait: nothing


def test_no_grace_ends_at_once(timers: list[Callable[[], None]], exits: list[int]) -> None:
    life = Lifecycle(None)
    life.request_stop("asked by exod")
    with life.interruptible():
        assert exits == [0] and timers == []
