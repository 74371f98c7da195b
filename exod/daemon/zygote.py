"""The daemon's side of the zygote (exod.runner.start.zygote): runners forked from a process that
has already imported what a runner imports, instead of each exec'd and importing it all again.

The zygote is started (`start`) when the first instance that can use it is about to run: at
start-up the daemon waits for its imports (`ready`, at most READY_WAIT), later ones do not wait.
From then on a runner whose launch `fits` is forked: its three descriptors go to the zygote with
its environment, and the answer is its pid, the daemon's child from then on (the daemon is the
subreaper of its descendants, so the runner is re-parented to it when the zygote's middle
process exits). Anything that does not fit, and every runner after the zygote failed, declined
or was too slow to answer (FORK_WAIT), is exec'd as before (exod.daemon.spawn), so the zygote
can make a start cheaper, never make one fail. What it saves: `python -m bench runner_start`.

On by default on Linux; EXOD_ZYGOTE=0 in the daemon's environment execs every runner.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import sys
from collections.abc import Mapping
from pathlib import Path

from loguru import logger

from exod.wire import zygote as wire
from exod.child_start import python_argv
from exod.daemon import spawn as os_seam
from exod.wire.protocol import ProtocolError

# Set by the daemon for people and their tools, per rank: the only variables a forked runner's
# environment may differ from the zygote's by (a runner reads its spec, not these).
PER_RANK_ENV = ("EXOD_INSTANCE", "EXOD_RANK")
# The event loop waits for one fork's answer at most this long (a fork takes milliseconds);
# past it the zygote is given up and the runner is exec'd.
FORK_WAIT = 1.0
# At start-up, the first runners wait this long at most for the zygote's imports.
READY_WAIT = 10.0
PR_SET_CHILD_SUBREAPER = 36


def enabled(env: Mapping[str, str]) -> bool:
    return sys.platform.startswith("linux") and env.get("EXOD_ZYGOTE", "1") != "0"


def fits(env: Mapping[str, str], module: str, zygote_env: Mapping[str, str],
         zygote_module: str) -> bool:
    """May a runner with `env` and `module` be forked from this zygote? Only if it would
    import the same modules with the same environment."""
    own = {k: v for k, v in env.items() if k not in PER_RANK_ENV}
    return module == zygote_module and own == dict(zygote_env)


def become_subreaper() -> bool:
    """Orphaned descendants (a forked runner, once the zygote's middle process exits) become
    this process's children, not init's."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class Zygote:
    def __init__(self, module: str, env: Mapping[str, str], cwd: Path) -> None:
        self.module = module
        self.cwd = cwd  # the daemon's runtime folder: the runners it forks run there too
        self.env = {k: v for k, v in env.items() if k not in PER_RANK_ENV}
        self.pid: int | None = None
        self.state = "idle"  # idle -> starting -> ready | gone
        self.why = ""  # why it is gone
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._first: asyncio.Future[None] | None = None

    def fits(self, env: Mapping[str, str], module: str) -> bool:
        return self.state in ("idle", "starting", "ready") and fits(env, module, self.env,
                                                                     self.module)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Exec the zygote; its imports then run while the daemon goes on."""
        if self.state != "idle":
            return
        if not become_subreaper():
            self._gone("this kernel cannot make exod the subreaper of its runners")
            return
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            os_seam.seal_inherited((theirs.fileno(),))
            os.set_inheritable(theirs.fileno(), True)
            argv = python_argv(self.module, ["--zygote-fd", str(theirs.fileno())], self.cwd)
            self.pid = os.posix_spawn(
                sys.executable, argv, self.env, setpgroup=0, setsigdef=os_seam.RESET_SIGNALS,
                setsigmask=(), file_actions=[(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY,
                                              0)])
        except OSError as e:
            ours.close()
            self._gone(f"cannot start it: {e.strerror}")
            return
        finally:
            theirs.close()
        self._sock = ours
        ours.setblocking(False)
        self.state = "starting"
        self._loop = loop
        self._first = loop.create_future()
        loop.add_reader(ours, self._on_first, loop)
        logger.debug("zygote pid {}: importing what a runner imports", self.pid)

    async def ready(self, timeout: float) -> bool:
        """Wait (at most `timeout`) for the zygote's imports; True once it forks runners."""
        if self._first is not None and not self._first.done():
            try:
                await asyncio.wait_for(asyncio.shield(self._first), timeout)
            except asyncio.TimeoutError:
                pass
        return self.state == "ready"

    def _on_first(self, loop: asyncio.AbstractEventLoop) -> None:
        assert self._sock is not None
        loop.remove_reader(self._sock)
        self._loop = None
        try:
            got = wire.recv(self._sock, wire.FROM_ZYGOTE)
        except (OSError, ProtocolError) as e:
            got, why = None, str(e)
        else:
            why = "it exited before it was ready"
        msg = got[0] if got is not None else None
        if isinstance(msg, wire.ZygoteReady):
            self.state = "ready"
            logger.info("zygote pid {} ready: runners are forked from it (EXOD_ZYGOTE=0: "
                        "exec each)", self.pid)
        elif isinstance(msg, wire.ZygoteDeclined):
            self._gone(msg.reason)
        else:
            self._gone(why if msg is None else f"it said {msg.type} first")
        if self._first is not None and not self._first.done():
            self._first.set_result(None)

    def fork(self, env: Mapping[str, str]) -> os_seam.Child | None:
        """A runner forked with `env`, or None (the caller execs it) when the zygote is not
        ready or fails."""
        if self.state != "ready" or self._sock is None:
            return None
        ends = os_seam.make_ends()
        try:
            self._sock.settimeout(FORK_WAIT)
            wire.send(self._sock, wire.Fork(dict(env)), list(ends.child_fds()))
            got = wire.recv(self._sock, wire.FROM_ZYGOTE)
        except (OSError, ProtocolError) as e:  # socket.timeout is an OSError
            ends.close()  # a runner forked late finds its channel closed, and stops
            if isinstance(e, TimeoutError) and self.pid is not None:
                # Stuck (it is not reaped: the loop is here, so its pid is still its own).
                # Its group: it, a middle process, a grandchild stuck before setpgid. It holds
                # no model and no device, and there is nothing to save.
                with contextlib.suppress(OSError):
                    os.killpg(self.pid, signal.SIGKILL)
            self._gone(f"no answer within {FORK_WAIT:g}s" if isinstance(e, TimeoutError)
                       else f"it exited ({e})" if isinstance(e, OSError) else str(e))
            return None
        msg = got[0] if got is not None else None
        if isinstance(msg, wire.Forked):
            return ends.started(msg.pid)
        ends.close()
        if isinstance(msg, wire.ForkFailed):
            logger.warning("zygote: {}; this runner is exec'd", msg.reason)
        else:
            self._gone("it exited" if msg is None else f"it answered {msg.type}")
        return None

    def _gone(self, why: str) -> None:
        """Never used again: every runner is exec'd from now on."""
        if self.state == "gone":
            return
        self.state, self.why = "gone", why
        logger.warning("zygote: {}; runners are exec'd", why)
        self.close()

    def close(self) -> None:
        """The zygote ends when its socket does (the daemon reaps it as a stray child)."""
        if self._sock is not None:
            if self._loop is not None:
                self._loop.remove_reader(self._sock)  # still waiting for its first word
            self._sock.close()
            self._sock = None
        self.state = "gone"
        if self._first is not None and not self._first.done():
            self._first.set_result(None)
