"""exod.runner.serving.busy_notice: what the reader says while it reads a long request."""

from __future__ import annotations

import threading

import pytest

from exod.runner.serving.busy_notice import Meanwhile


def test_says_nothing_for_a_quick_read() -> None:
    said: list[int] = []
    m = Meanwhile(every=60)
    for _ in range(100):
        with m.busy(lambda: said.append(1)):
            pass
    assert said == []


def test_speaks_on_time_while_the_read_lasts_and_never_after() -> None:
    m = Meanwhile(every=0.01)
    for _ in range(2):  # one thread serves every read
        twice = threading.Event()
        said: list[int] = []

        def say(said: list[int] = said, twice: threading.Event = twice) -> None:
            said.append(1)
            if len(said) >= 2:
                twice.set()

        with m.busy(say):
            assert twice.wait(30)  # the read lasts until it has been heard twice
        n = len(said)
        assert n >= 2
        with m.busy(lambda: None):
            pass
        assert len(said) == n  # nothing said for a read that is over


def test_a_failure_to_speak_is_raised_in_the_reader() -> None:
    m = Meanwhile(every=0.01)
    failed = threading.Event()

    def say() -> None:
        failed.set()
        raise ConnectionError("peer gone")

    with pytest.raises(ConnectionError, match="peer gone"):
        with m.busy(say):
            assert failed.wait(30)
    with m.busy(lambda: None):  # the next read starts clean
        pass
