"""The sd_notify wire format from exod to its service manager: every message type arrives as
systemd expects it, on path and '@' abstract sockets; nothing happens (and nothing fails)
without NOTIFY_SOCKET. (Runners speak to exod over their channel: tests/integration/
test_channel.py.)"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from exod.daemon.manager_notify import ServiceNotifier
from tests.harness import NotifyListener

SYSTEMD_NOTIFY = shutil.which("systemd-notify") or "/bin/systemd-notify"


def notifier_for(monkeypatch: pytest.MonkeyPatch, address: str) -> ServiceNotifier:
    monkeypatch.setenv("NOTIFY_SOCKET", address)
    return ServiceNotifier()


def test_every_message_type_reaches_the_manager(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    listener = NotifyListener(tmp_path / "m.sock")
    try:
        n = notifier_for(monkeypatch, str(listener.path))
        n.ready("1/1 ready")
        n.status("2/3 ready; big: loading 17/80 — ünïcode ✓")
        n.reloading()
        n.stopping("stopping; ladder worst case 25s")
        n.watchdog()
        n.extend_timeout(12.5)
        n.errno(98, "cannot start: address in use")
        listener.wait_for(lambda f: "ERRNO" in f)  # the last one: all have arrived, in order
        got = listener.fields()
        assert len(got) == 7, got
        assert got[0] == {"READY": "1", "STATUS": "1/1 ready"}
        assert got[1] == {"STATUS": "2/3 ready; big: loading 17/80 — ünïcode ✓"}  # UTF-8 intact
        assert got[2]["RELOADING"] == "1" and got[2]["STATUS"] == "reloading"
        # MONOTONIC_USEC is CLOCK_MONOTONIC, as systemd compares it with its own clock.
        mono = int(got[2]["MONOTONIC_USEC"])
        assert abs(mono - time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000) < 60_000_000
        assert got[3]["STOPPING"] == "1" and "worst case" in got[3]["STATUS"]
        assert got[4] == {"WATCHDOG": "1"}
        assert got[5] == {"EXTEND_TIMEOUT_USEC": "12500000"}
        assert got[6] == {"ERRNO": "98", "STATUS": "cannot start: address in use"}
        assert {pid for pid, _ in listener.messages} == {os.getpid()}
    finally:
        listener.close()


def test_abstract_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    name = f"exod-test-{os.getpid()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(30)
    try:
        notifier_for(monkeypatch, "@" + name).ready("ok")
        assert sock.recv(4096) == b"READY=1\nSTATUS=ok"
    finally:
        sock.close()


def test_without_notify_socket_nothing_happens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    n = ServiceNotifier()
    assert not n.enabled and n.send("READY=1") is False
    n.ready("x")  # no exception, nothing to send to


def test_missing_socket_is_reported_not_raised(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    n = notifier_for(monkeypatch, str(tmp_path / "absent.sock"))
    assert n.send("READY=1") is False  # sdnotify would have swallowed this silently
