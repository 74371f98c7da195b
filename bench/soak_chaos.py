"""The soak's chaos (bench.soak): one event every `every` seconds, in turn, plus the daemon's
own restarts at set times.

- kill: SIGKILL to a runner (the chat, picture and embedding instances in turn);
- freeze: SIGSTOP to a runner (`hang_after` notices; the ladder ends it);
- disk full: the prompt cache's filesystem filled to its last 64 KiB, until `disk free`;
- restart: `exoctl restart` of an instance;
- reload: the config rewritten (a queue's length changes) and SIGHUP;
- the daemon: SIGTERM (its whole ladder), then started again on the same port.

The `steady` and `rank` instances take no runner chaos: their runners live as long as the
daemon, so their memory is measured over a whole life.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.harness import Daemon

EVENTS = ("kill", "freeze", "disk full", "restart", "reload", "disk free")
TARGETS = {"kill": ("soak", "eye", "vec"), "freeze": ("soak", "eye"), "restart": ("soak", "vec")}


def runner_pid(d: Daemon, name: str) -> int | None:
    try:
        ranks = d.instance(name).get("ranks") or []
    except (OSError, StopIteration, ValueError):
        return None
    pid = ranks[0].get("pid") if ranks else None
    return int(pid) if pid else None


class Disk:
    """The prompt cache's own filesystem (a tmpfs), filled and freed on cue."""

    def __init__(self, where: Path) -> None:
        self.filler = where / ".filler"

    def fill(self) -> None:
        st = os.statvfs(self.filler.parent)
        free = st.f_bavail * st.f_frsize
        with open(self.filler, "wb") as f:
            os.posix_fallocate(f.fileno(), 0, max(0, free - 64 * 1024))

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)


class Chaos:
    def __init__(self, d: Daemon, disk: Disk | None, every: float, restarts_at: list[float],
                 config: Callable[[int], dict[str, Any]]) -> None:
        self.d, self.disk, self.every, self.config = d, disk, every, config
        self.restarts_at = sorted(restarts_at)  # seconds from the start
        self.counts: Counter[str] = Counter()
        self.lives: list[tuple[float, int]] = []  # (start, daemon pid) of each life
        self.daemon_lock = threading.Lock()  # held while the daemon is down
        self.stop = threading.Event()
        self.failed = ""  # what ended the chaos thread early, if anything did

    def run(self, t0: float) -> None:
        try:
            self.events(t0)
        except Exception as e:  # said in the report: a thread's traceback scrolls away
            self.failed = f"{type(e).__name__}: {e}"
            raise

    def events(self, t0: float) -> None:
        assert self.d.proc is not None
        self.lives.append((0.0, self.d.proc.pid))
        n = 0
        next_event = t0 + self.every
        while True:
            restart = t0 + self.restarts_at[0] if self.restarts_at else float("inf")
            if self.stop.wait(max(0.0, min(next_event, restart) - time.monotonic())):
                break
            if restart <= time.monotonic():
                self.restarts_at.pop(0)
                self.restart_daemon(t0)
                continue
            self.event(EVENTS[n % len(EVENTS)], n // len(EVENTS))
            next_event += self.every
            n += 1
        if self.disk is not None:
            self.disk.free()

    def event(self, what: str, round_: int) -> None:
        targets = TARGETS.get(what, ("soak",))
        name = targets[round_ % len(targets)]
        try:
            if what in ("kill", "freeze"):
                pid = runner_pid(self.d, name)
                if pid is None:
                    return
                os.kill(pid, signal.SIGKILL if what == "kill" else signal.SIGSTOP)
            elif what == "restart":
                self.d.ctl("restart", name, check=False, timeout=120)
            elif what == "reload":
                self.d.write_config(self.config(round_ % 2))
                self.d.send_signal(signal.SIGHUP)
            elif self.disk is None:
                return
            elif what == "disk full":
                self.disk.fill()
            else:
                self.disk.free()
        except (ProcessLookupError, OSError):
            return
        self.counts[what if what not in TARGETS else f"{what} {name}"] += 1

    def restart_daemon(self, t0: float) -> None:
        """SIGTERM, as `systemctl restart` sends: the daemon's ladder stops every runner; then
        a new daemon on the same config, port and cache."""
        with self.daemon_lock:
            self.d.terminate(signal.SIGTERM, timeout=300)
            self.d.start()
            assert self.d.proc is not None
            self.lives.append((time.monotonic() - t0, self.d.proc.pid))
        self.counts["daemon restart"] += 1
