"""Test harness: a real `exod run` process, driven and observed the way a service manager and an
operator would: a notify socket the daemon reports to (so "ready" is READY=1, not a sleep),
its control socket (exoctl and the `watch` stream, so state changes are events, not polls),
and its JSON log (every ladder step and exit, as structured records).

Timeouts here are generous safety bounds; nothing waits for a fixed time.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterator

import yaml

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
EXOD = [str(BIN / "exod")]
EXOCTL = [str(BIN / "exoctl")]
SAFETY = 120.0  # seconds: only a bound against hangs
# What a daemon under test execs for its runners: tests/doubles/runner.py, which runs the real
# runner unless an instance's env names a misbehaviour (EXOD_DOUBLE). Set in the daemon's own
# environment: a config file can never choose what gets exec'd.
# A valid one-pixel PNG, base64: a picture for a model that cannot see (the refusal under test
# is the model's, not the picture's).
ONE_PIXEL_PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAA"
                 "AABJRU5ErkJggg==")
DOUBLES_ENV = {"EXOD_RUNNER_MODULE": "tests.doubles.runner", "PYTHONPATH": str(REPO)}


class NotifyListener:
    """A minimal service manager: a thread receives sd_notify datagrams (with the sender's pid)
    as they come, as systemd does, so the daemon is never throttled by a slow reader."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.messages: list[tuple[int, dict[str, str]]] = []
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                data, anc, _, _ = self.sock.recvmsg(65536, socket.CMSG_SPACE(12)
                                                    + socket.CMSG_SPACE(64))
            except OSError:
                return
            if self._closed:
                return
            pid = -1
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    pid = struct.unpack("iII", payload[:12])[0]
                elif level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    for (fd,) in struct.iter_unpack("i", payload[: len(payload) // 4 * 4]):
                        os.close(fd)
            fields = {}
            for line in data.decode().split("\n"):
                k, sep, v = line.partition("=")
                if sep:
                    fields[k] = v
            with self._cond:
                self.messages.append((pid, fields))
                self._cond.notify_all()

    def wait_for(self, pred: Callable[[dict[str, str]], bool], timeout: float = SAFETY,
                 start: int = 0, gone: Callable[[], str] | None = None) -> dict[str, str]:
        """The first message from index `start` on that matches. `gone`: why waiting is
        pointless (the sender exited), checked every half second, so a daemon that died at
        start fails the test at once instead of after the whole safety bound."""
        deadline = time.monotonic() + timeout
        with self._cond:
            i = start
            while True:
                while i < len(self.messages):
                    if pred(self.messages[i][1]):
                        return self.messages[i][1]
                    i += 1
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no matching notify message in {timeout}s; "
                                       f"got {[m for _, m in self.messages]}")
                why = gone() if gone is not None else ""
                if why:
                    raise RuntimeError(f"no matching notify message: {why}; "
                                       f"got {[m for _, m in self.messages]}")
                self._cond.wait(min(left, 0.5))

    def count(self) -> int:
        with self._cond:
            return len(self.messages)

    def fields(self) -> list[dict[str, str]]:
        with self._cond:
            return [f for _, f in self.messages]

    def close(self) -> None:
        self._closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the thread's recvmsg
        except OSError:
            pass
        self._thread.join(5)
        self.sock.close()


class Daemon:
    """One `exod run` under test, with its own config, sockets and log."""

    def __init__(self, config: dict[str, Any], env: dict[str, str] | None = None,
                 name: str = "exod") -> None:
        # AF_UNIX paths are limited to ~107 bytes: keep the run folder short.
        self.dir = Path(tempfile.mkdtemp(prefix=f"{name}-"))
        self.socket = self.dir / "run" / "control.sock"
        self.config_path = self.dir / "exod.yaml"
        self.log_path = self.dir / "exod.log"
        # The HTTP API on a port the kernel picks (status tells which): tests never collide.
        config = {"control": {"socket": str(self.socket)}, "api": {"listen": "127.0.0.1:0"},
                  **config}
        self.write_config(config)
        self.listener = NotifyListener(self.dir / "notify-manager.sock")
        # Its state (the reasoning seal key) in its own folder, kept across its restarts; and
        # CACHE_DIRECTORY (a user unit's CacheDirectory=): the prompt cache's disk tier in its
        # own folder too, never the host's (root's default is /var/lib/exod) nor another test
        # daemon's (a hit there would change what this one counts).
        self.env = {**os.environ, "NOTIFY_SOCKET": str(self.listener.path), **DOUBLES_ENV,
                    "XDG_STATE_HOME": str(self.dir / "state"),
                    "CACHE_DIRECTORY": str(self.dir / "cache"), **(env or {})}
        self.env.pop("EXOD_SOCKET", None)
        self.proc: subprocess.Popen[bytes] | None = None
        self.pids_seen: set[int] = set()
        self._since = 0  # notify messages before the last start

    def write_config(self, config: dict[str, Any] | str) -> None:
        if not isinstance(config, str):
            # `control` and `api` on one line each (flow style): the lines of everything after
            # them stay where tests expect them (positions in config errors).
            head = {k: config[k] for k in ("control", "api") if k in config}
            rest = {k: v for k, v in config.items() if k not in head}
            config = yaml.safe_dump(head, sort_keys=False, default_flow_style=None) + (
                yaml.safe_dump(rest, sort_keys=False) if rest else "")
        self.config_path.write_text(config)

    # ---- lifecycle --------------------------------------------------------------------
    def start(self, wait_ready: bool = True, args: tuple[str, ...] = (),
              session: bool = False, prefix: tuple[str, ...] = ()) -> Daemon:
        """`prefix`: e.g. `ip netns exec NS`, to run the daemon on another test host."""
        log = open(self.log_path, "ab")
        self._since = self.listener.count()  # a start again: READY=1 from this process on
        self.proc = subprocess.Popen(
            [*prefix, *EXOD, "run", "-c", str(self.config_path), "--log-format", "json", *args],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=self.env, cwd=self.dir,
            start_new_session=session,
        )
        log.close()
        if wait_ready:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = SAFETY) -> dict[str, str]:
        return self.listener.wait_for(lambda f: f.get("READY") == "1", timeout,
                                      start=self._since, gone=self._exited)

    def _exited(self) -> str:
        code = self.proc.poll() if self.proc is not None else None
        if code is None:
            return ""
        tail = self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
        return f"the daemon exited with {code}; its log ends:\n{tail}"

    def send_signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def terminate(self, sig: int = signal.SIGTERM, timeout: float = SAFETY) -> int:
        assert self.proc is not None
        self._remember_pids()
        self.proc.send_signal(sig)
        return self.proc.wait(timeout)

    def close(self) -> None:
        """Cleanup, even after a failed test: no daemon or runner may outlive it."""
        if self.proc is not None and self.proc.poll() is None:
            self._remember_pids()
            self.proc.kill()
            self.proc.wait(10)
        for pid in self.pids_seen:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.listener.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _remember_pids(self) -> None:
        for rec in self.events():
            pid = rec["extra"].get("pid")
            if pid:
                self.pids_seen.add(int(pid))

    # ---- control ------------------------------------------------------------------------
    def ctl(self, *args: str, check: bool = True, timeout: float = SAFETY
            ) -> subprocess.CompletedProcess[str]:
        res = subprocess.run([*EXOCTL, "--socket", str(self.socket), *args], capture_output=True,
                             text=True, timeout=timeout, check=False)
        if check and res.returncode != 0:
            raise AssertionError(f"exoctl {' '.join(args)} → {res.returncode}\n{res.stdout}"
                                 f"{res.stderr}\n--- daemon log ---\n{self.log_text()}")
        return res

    def stream(self, req: dict[str, Any], timeout: float = SAFETY) -> Iterator[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(str(self.socket))
            s.sendall(json.dumps(req).encode() + b"\n")
            with s.makefile("rb") as f:
                while True:
                    s.settimeout(max(0.01, deadline - time.monotonic()))
                    line = f.readline()
                    if not line:
                        return
                    yield json.loads(line)

    def request(self, req: dict[str, Any], timeout: float = SAFETY) -> dict[str, Any]:
        msgs = list(self.stream(req, timeout))
        return msgs[-1]

    def status(self) -> dict[str, Any]:
        return self.request({"cmd": "status"})

    def api_url(self) -> str:
        """Base URL of the daemon's HTTP API (from its status), e.g. http://127.0.0.1:41234."""
        api = self.status()["daemon"]["api"]
        assert api, "the HTTP API is disabled in this daemon's config"
        return str(api["url"])

    def instance(self, name: str) -> dict[str, Any]:
        return next(i for i in self.status()["instances"] if i["name"] == name)

    def watch_until(self, pred: Callable[[dict[str, Any]], bool], timeout: float = SAFETY,
                    what: str = "condition") -> dict[str, Any]:
        """Follow the daemon's change stream until `pred(snapshot)`; returns that snapshot.
        A stream the daemon ends because this reader fell behind (many instances changing at
        once, a loaded machine) is followed again from a fresh snapshot, as a client should."""
        seen: list[str] = []
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                for snap in self.stream({"cmd": "watch"}, deadline - time.monotonic()):
                    if "daemon" not in snap:  # the stream's end: only a slow reader's is expected
                        assert "read too slowly" in snap.get("error", ""), snap
                        break
                    seen.append(snap["daemon"]["summary"])
                    if pred(snap):
                        return snap
                else:
                    break  # the daemon closed the stream
        except TimeoutError:
            pass
        raise AssertionError(f"timed out waiting for {what}; summaries seen: {seen[-10:]}\n"
                             f"--- daemon log ---\n{self.log_text()}")

    def until_instance(self, name: str, pred: Callable[[dict[str, Any]], bool],
                       timeout: float = SAFETY, what: str = "") -> dict[str, Any]:
        def check(snap: dict[str, Any]) -> bool:
            return any(i["name"] == name and pred(i) for i in snap["instances"])

        snap = self.watch_until(check, timeout, what or f"{name} condition")
        return next(i for i in snap["instances"] if i["name"] == name)

    def until_state(self, name: str, state: str, timeout: float = SAFETY) -> dict[str, Any]:
        return self.until_instance(name, lambda i: i["state"] == state, timeout,
                                   f"{name} to be {state}")

    # ---- logs ---------------------------------------------------------------------------
    def log_text(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return ""
        out = []
        for line in lines[-200:]:
            try:
                rec = json.loads(line)
                out.append(rec["text"].rstrip())
            except (ValueError, KeyError):
                out.append(line)
        return "\n".join(out)

    def events(self, **match: Any) -> list[dict[str, Any]]:
        """Structured log records whose `extra` has every key=value in `match`."""
        out = []
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return out
        for line in lines:
            try:
                rec = json.loads(line)["record"]
            except (ValueError, KeyError, TypeError):
                continue
            extra = rec.get("extra", {})
            if all(extra.get(k) == v for k, v in match.items()):
                out.append(rec)
        return out


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listened on a moment ago (for servers that cannot
    take port 0 and report back)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_block(n: int) -> int:
    """The first of n free ports in a row, for a fixed `port_base`. Taken below the ephemeral
    range, because every test's outgoing connections take their source ports from that range and
    would squat a group's port between our check and the runner's bind (CI saw rank 1 find its
    port held through five restarts). Each xdist worker draws from its own slice, so two tests
    running side by side never pick overlapping blocks."""
    from exod.daemon.rank_addresses import ephemeral_range, is_free
    top = ephemeral_range()[0] - n
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(worker) if worker.isdigit() else 0
    width = (top - 10_000) // max(count, 1)
    low = 10_000 + index * width
    while True:
        base = random.randrange(low, low + width - n)
        if all(is_free(base + i) for i in range(n)):
            return base


def pid_alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_pid_gone(pid: int, timeout: float = SAFETY) -> bool:
    """Block until `pid` (not necessarily our child) has exited, via a pidfd: an event, not a
    poll. True if it is gone within `timeout`."""
    import select

    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        p = select.poll()
        p.register(fd, select.POLLIN)
        return bool(p.poll(timeout * 1000))
    finally:
        os.close(fd)


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) `pid` has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_share(pid: int, window: float) -> float:
    """The share of one core `pid` uses over the next `window` seconds (a measurement window,
    not a wait for anything)."""
    before, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(window)
    return (cpu_seconds(pid) - before) / (time.monotonic() - t0)


def waiting_for_a_frozen_peer(d: Daemon, name: str, window: float) -> tuple[float, int]:
    """Freeze rank 1 of group `name` (SIGSTOP) once it has loaded a layer, measure rank 0 while
    it waits for it (its share of a core over `window`), then let rank 1 go on: (share, how
    many layers rank 1 had loaded when measured)."""
    first = d.until_instance(name, lambda i: i["ranks"][1]["layers_loaded"] >= 1,
                             what="rank 1 loading")
    slow = first["ranks"][1]["pid"]
    os.kill(slow, signal.SIGSTOP)
    try:
        inst = d.until_instance(name, lambda i: i["ranks"][0]["phase"] == "waiting",
                                what="rank 0 waiting for rank 1")
        return cpu_share(inst["ranks"][0]["pid"], window), inst["ranks"][1]["layers_loaded"]
    finally:
        os.kill(slow, signal.SIGCONT)
