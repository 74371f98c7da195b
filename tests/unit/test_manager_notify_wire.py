"""The text both sd_notify senders put on the wire, and the watchdog interval they obey."""

from __future__ import annotations

import os

import pytest

from exod.daemon.manager_notify import one_line, watchdog_interval, wire


def test_wire_carries_utf8_through_a_latin1_encoder() -> None:
    text = wire(["STATUS=ready — 1/2", "READY=1"])
    assert text.encode("latin-1") == "STATUS=ready — 1/2\nREADY=1".encode()


def test_one_line() -> None:
    assert one_line("  cannot load\n  model:\tbad  ") == "cannot load model: bad"


@pytest.mark.parametrize(("usec", "pid", "expected"), [
    (None, None, None), ("", None, None), ("abc", None, None), ("0", None, None),
    ("-5", None, None), ("30000000", None, 15.0), ("30000000", "self", 15.0),
    ("30000000", "1", None)])
def test_watchdog_interval(monkeypatch: pytest.MonkeyPatch, usec: str | None, pid: str | None,
                           expected: float | None) -> None:
    for key, value in (("WATCHDOG_USEC", usec), ("WATCHDOG_PID", pid)):
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, str(os.getpid()) if value == "self" else value)
    assert watchdog_interval() == expected
