"""The sd_notify wire format, both ways, with systemd-notify as the reference peer.

- exod → service manager: every message type arrives as systemd expects it, on path and
  '@' abstract sockets; nothing happens (and nothing fails) without NOTIFY_SOCKET.
- runner → exod: exod's notify server understands systemd-notify itself (and closes the fd its
  BARRIER=1 sends, or systemd-notify would wait 5 s), and exod's own runner notifier.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from exod.daemon.notify_server import NotifyServer
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


def serve_notify(path: Path, run: list[str], env: dict[str, str]) -> tuple[list, float, int]:
    """Run `run` against an exod NotifyServer on `path`; returns (messages, seconds, rc)."""
    got: list[tuple[int, dict[str, str]]] = []

    async def main() -> tuple[float, int]:
        loop = asyncio.get_running_loop()
        server = NotifyServer(path, lambda pid, f: got.append((pid, f)))
        server.open(loop)
        t = time.monotonic()
        proc = await asyncio.create_subprocess_exec(*run, env=env)
        rc = await asyncio.wait_for(proc.wait(), 60)
        elapsed = time.monotonic() - t
        server.drain()  # whatever arrived after the last reader callback
        server.close(loop)
        return elapsed, rc

    elapsed, rc = asyncio.run(main())
    return got, elapsed, rc


def test_systemd_notify_as_reference_client(tmp_path: Path) -> None:
    env = {**os.environ, "NOTIFY_SOCKET": str(tmp_path / "exod-notify.sock")}
    got, elapsed, rc = serve_notify(
        tmp_path / "exod-notify.sock",
        [SYSTEMD_NOTIFY, "--ready", "--status=loading 3/8", "X_EXOD_LAYERS=3/8"], env)
    assert rc == 0
    # systemd-notify waits for its BARRIER fd to be closed: exod closes it at once.
    assert elapsed < 4.0, f"systemd-notify waited {elapsed:.1f}s: the barrier fd was kept open"
    fields = {k: v for _, f in got for k, v in f.items()}
    assert fields["READY"] == "1" and fields["STATUS"] == "loading 3/8"
    assert fields["X_EXOD_LAYERS"] == "3/8"
    # The sender is identified by SCM_CREDENTIALS (systemd-notify sends its parent's pid).
    assert all(pid > 0 for pid, _ in got)


def test_runner_notifier_speaks_the_same_format(tmp_path: Path) -> None:
    code = ("from exod.runner.notify import Notifier; n = Notifier(); n.status('starting'); "
            "n.progress(3, 8); n.ready(); n.watchdog(); n.stopping(); n.error('bad — model')")
    path = tmp_path / "n.sock"
    env = {**os.environ, "NOTIFY_SOCKET": str(path)}
    got, _, rc = serve_notify(path, [sys.executable, "-c", code], env)
    assert rc == 0
    msgs = [f for _, f in got]
    assert msgs[0]["STATUS"] == "starting"
    assert msgs[1]["X_EXOD_LAYERS"] == "3/8" and msgs[1]["STATUS"] == "loading 3/8"
    assert msgs[2]["READY"] == "1"
    assert msgs[3]["WATCHDOG"] == "1"
    assert msgs[4]["STOPPING"] == "1"
    assert msgs[5]["X_EXOD_ERROR"] == "bad — model"
    pids = {pid for pid, _ in got}
    assert len(pids) == 1 and all(int(m["X_EXOD_PID"]) in pids for m in msgs)
