"""exod.runner.meanwhile: what a busy serve loop says while it reads a long request."""

from __future__ import annotations

import threading

import pytest

from exod.runner.meanwhile import Meanwhile


def test_says_nothing_for_a_quick_call() -> None:
    said: list[int] = []
    with Meanwhile(lambda: said.append(1), every=60):
        pass
    assert said == []


def test_speaks_on_time_while_the_call_lasts() -> None:
    twice = threading.Event()
    said: list[int] = []

    def say() -> None:
        said.append(1)
        if len(said) >= 2:
            twice.set()

    with Meanwhile(say, every=0.01):
        assert twice.wait(30)  # the block lasts until it has been heard twice
    n = len(said)
    assert n >= 2
    assert len(said) == n  # nothing said after the block


def test_a_failure_to_speak_is_raised_in_the_caller() -> None:
    failed = threading.Event()

    def say() -> None:
        failed.set()
        raise ConnectionError("peer gone")

    with pytest.raises(ConnectionError, match="peer gone"):
        with Meanwhile(say, every=0.01):
            assert failed.wait(30)
