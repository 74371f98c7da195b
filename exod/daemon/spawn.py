"""The OS seam for runner processes: spawn by exec, signal, and read their exit.

Runners are started with posix_spawn (exec of `python -m exod.runner --channel-fd N`), never by
forking the daemon: a fork would copy the event loop, sockets and threads. Each runner gets its
own process group (so a terminal's Ctrl-C and launchd's group signal reach only the daemon),
/dev/null as stdin, pipes for stdout/stderr, and one end of a socketpair as its channel, whose
descriptor is all its command line holds (its spec comes on the channel: exod.specs).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass

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
    return env


DEFAULT_MODULE = "exod.runner"


def spawn(env: Mapping[str, str], module: str = DEFAULT_MODULE) -> Child:
    """Start `python -m MODULE --channel-fd N`; raises OSError if exec fails."""
    parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    keep = (child_end.fileno(), out_w, err_w)
    try:
        seal_inherited(keep)
        # Inheritable only for the instant of the spawn: the loop is single-threaded, so no
        # other spawn can pick these up.
        for fd in keep:
            os.set_inheritable(fd, True)
        argv = [sys.executable, "-m", module, "--channel-fd", str(child_end.fileno())]
        actions = [
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_DUP2, out_w, 1),
            (os.POSIX_SPAWN_DUP2, err_w, 2),
            (os.POSIX_SPAWN_CLOSE, out_w),
            (os.POSIX_SPAWN_CLOSE, err_w),
        ]
        pid = os.posix_spawn(
            sys.executable, argv, dict(env), file_actions=actions, setpgroup=0,
            setsigdef=RESET_SIGNALS, setsigmask=(),
        )
    except BaseException:
        parent_end.close()
        os.close(out_r)
        os.close(err_r)
        raise
    finally:
        child_end.close()
        os.close(out_w)
        os.close(err_w)
    os.set_blocking(out_r, False)
    os.set_blocking(err_r, False)
    parent_end.setblocking(False)
    return Child(pid, out_r, err_r, parent_end)


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
