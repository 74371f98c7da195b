"""The OS seam for runner processes: spawn by exec, signal, and read their exit.

Runners are started with posix_spawn (exec of `python -m exod.runner --channel-fd N`, in
safe-path mode and in the daemon's runtime folder: exod.child_start), never by forking the
daemon: a fork would copy the event loop, sockets and threads. Each runner gets its own process
group (so a terminal's Ctrl-C and launchd's group signal reach only the daemon), /dev/null as
stdin, pipes for stdout/stderr, and one end of a socketpair as its channel, whose descriptor is
all its command line holds (its spec comes on the channel: exod.wire.specs).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from exod.child_start import explicit_path, python_argv
from exod.core.exits import ExitInfo

# Variables that speak for the service itself: a runner must never inherit them, or it could
# e.g. tell systemd READY=1 on the daemon's behalf, or adopt the daemon's watchdog.
SERVICE_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID",
               "LISTEN_FDNAMES", "JOURNAL_STREAM")

# Hub tokens: exod's fetcher reads its token from hub.hf_token_file; no child inherits one.
TOKEN_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")

# Python ignores SIGPIPE and the daemon handles others; the runner starts from the defaults.
RESET_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE, signal.SIGCHLD,
                 signal.SIGUSR1, signal.SIGUSR2)


@dataclass
class Child:
    pid: int
    stdout: int  # read ends, non-blocking
    stderr: int
    channel: socket.socket  # the daemon's end


def runner_env(base: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in base.items()
           if k not in SERVICE_ENV and k not in TOKEN_ENV and not k.startswith("LISTEN_")}
    env.update(extra)
    return explicit_path(env)  # the child runs elsewhere: PYTHONPATH as it reads from here


DEFAULT_MODULE = "exod.runner"


@dataclass
class Ends:
    """A child's channel and output pipes, both ends, before it starts."""

    parent: socket.socket
    child: socket.socket
    out_r: int
    out_w: int
    err_r: int
    err_w: int

    def child_fds(self) -> tuple[int, int, int]:
        return self.child.fileno(), self.out_w, self.err_w

    def started(self, pid: int) -> Child:
        """The child has its ends now: close ours of them, keep the rest."""
        self.close_child_side()
        os.set_blocking(self.out_r, False)
        os.set_blocking(self.err_r, False)
        self.parent.setblocking(False)
        return Child(pid, self.out_r, self.err_r, self.parent)

    def close_child_side(self) -> None:
        self.child.close()
        os.close(self.out_w)
        os.close(self.err_w)

    def close(self) -> None:
        """Nothing started (or what started is abandoned: it finds its channel closed)."""
        self.close_child_side()
        self.parent.close()
        os.close(self.out_r)
        os.close(self.err_r)


def make_ends() -> Ends:
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    return Ends(parent, child, out_r, out_w, err_r, err_w)


def spawn(env: Mapping[str, str], module: str, cwd: Path) -> Child:
    """Start `python -m MODULE --channel-fd N` in `cwd`; raises OSError if exec fails (a
    `cwd` that is gone makes the child exit 1 at once)."""
    ends = make_ends()
    keep = ends.child_fds()
    try:
        seal_inherited(keep)
        # Inheritable only for the instant of the spawn: the loop is single-threaded, so no
        # other spawn can pick these up.
        for fd in keep:
            os.set_inheritable(fd, True)
        argv = python_argv(module, ["--channel-fd", str(ends.child.fileno())], cwd)
        actions = [
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_DUP2, ends.out_w, 1),
            (os.POSIX_SPAWN_DUP2, ends.err_w, 2),
            (os.POSIX_SPAWN_CLOSE, ends.out_w),
            (os.POSIX_SPAWN_CLOSE, ends.err_w),
        ]
        pid = os.posix_spawn(
            sys.executable, argv, dict(env), file_actions=actions, setpgroup=0,
            setsigdef=RESET_SIGNALS, setsigmask=(),
        )
    except BaseException:
        ends.close()
        raise
    return ends.started(pid)


def _open_fds() -> list[int]:
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            return [int(name) for name in os.listdir(folder) if name.isdigit()]
        except OSError:
            continue
    return []


def seal_inherited(keep: tuple[int, ...]) -> None:
    """A runner gets stdin/stdout/stderr and its channel, nothing else: any other descriptor
    left inheritable (e.g. handed to exod by whatever started it) is made close-on-exec."""
    for fd in _open_fds():
        if fd > 2 and fd not in keep:
            try:
                if os.get_inheritable(fd):
                    os.set_inheritable(fd, False)
            except OSError:
                pass  # closed meanwhile (the listing's own fd)


def send_signal(pid: int, sig: int) -> bool:
    """False if the process is already gone (it may not have been reaped yet)."""
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def reap(pid: int) -> ExitInfo | None:
    """Non-blocking wait for one child: its ExitInfo, or None while it still runs."""
    try:
        got, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        # Already reaped elsewhere (should not happen: only the supervisor waits). It is gone,
        # and its status is lost; report a failure rather than pretend it exited cleanly.
        return ExitInfo(code=255)
    if got == 0:
        return None
    return ExitInfo.from_wait_status(status)


def waitable() -> int | None:
    """A child that has exited and is not reaped yet (left as it is), or None (also where
    Python has no waitid: macOS before 3.13)."""
    if not hasattr(os, "waitid"):
        return None
    try:
        info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return None
    return info.si_pid if info is not None and info.si_pid else None


def children() -> list[int] | None:
    """This process's children, exited or not (Linux's /proc/self/task/*/children); None
    where the kernel does not say."""
    pids: list[int] = []
    try:
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/children") as f:
                pids += [int(p) for p in f.read().split()]
    except (OSError, ValueError):
        return None
    return pids


def reap_stray(pid: int) -> bool:
    """Reap a child the daemon did not start as a runner if it has exited, unless it is in the
    daemon's own process group (a subprocess: whoever started it waits for it). True if it
    was reaped (or is gone)."""
    try:
        if os.getpgid(pid) == os.getpgrp():
            return False
        got, _ = os.waitpid(pid, os.WNOHANG)
    except (ProcessLookupError, ChildProcessError):
        return True  # reaped meanwhile by whoever started it
    return got != 0
