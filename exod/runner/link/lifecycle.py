"""How a runner learns that it must stop: the daemon's request, SIGTERM, or its parent's death.

All of them end in `request_stop`, which sets one event that the load loop checks between layers
and that wakes the serve loop. Signals are seen through `signal.set_wakeup_fd`: the interpreter's
C-level handler writes the signal's number to a pipe the instant it arrives, even while the main
thread sits in a long C call (a prefill, mx.distributed), and the channel thread
(`exod.runner.link.channel`), which watches that pipe, does the rest. The Python-level handler does
nothing; it only replaces the default action (death).

Runners ignore SIGINT: Ctrl-C in a terminal is for the daemon, which then runs its ladder.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType

from exod.runner.link.log import NOTICE, log

PR_SET_PDEATHSIG = 1


class Lifecycle:
    def __init__(self, parent_pid: int | None = None) -> None:
        """`parent_pid`: watched from `install`; a runner learns its parent from its spec, and
        watches it then (`watch_parent`)."""
        self.stop = threading.Event()
        self.reason = ""
        self.parent_pid = parent_pid
        self.wake_r, self._wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._on_stop: list[Callable[[], None]] = []
        self._interruptible: float | None = None  # grace, while blocked in C
        self._wait = 0  # counts the interruptible waits: a grace belongs to one of them

    @contextlib.contextmanager
    def interruptible(self, grace: float = 0.0) -> Iterator[None]:
        """The main thread is about to block in C (mx.distributed init, a worker waiting for
        its next header) where no flag is ever checked. A stop request meanwhile ends the
        process after `grace` seconds: a normal exit, never a SIGKILL."""
        self._interruptible = grace
        self._wait += 1
        try:
            if self.stop.is_set():
                self._exit_soon()
            yield
        finally:
            self._interruptible = None

    @contextlib.contextmanager
    def holding_the_interpreter(self) -> Iterator[None]:
        """`interruptible`, for a C call that keeps Python's interpreter lock while it blocks
        (mx.distributed's ring init waits in accept/connect so): no thread of ours runs
        meanwhile, to read a stop request or a signal, so SIGTERM's own action, the process's
        end, applies there. From the main thread; the handler comes back after."""
        with self.interruptible():
            previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
            try:
                yield
            finally:
                signal.signal(signal.SIGTERM, previous)

    def _exit_soon(self) -> None:
        grace, wait = self._interruptible, self._wait
        if grace is None:
            return

        def leave() -> None:
            # Only if still in that same wait: a worker that got its header and now waits for
            # the next one (following a drain) has a grace of its own.
            if self._interruptible is not None and self._wait == wait:
                log(f"stopping: {self.reason} (while waiting on the group)", NOTICE)
                os._exit(0)

        if grace <= 0:
            leave()
        else:
            threading.Timer(grace, leave).start()

    def on_stop(self, fn: Callable[[], None]) -> None:
        self._on_stop.append(fn)

    def request_stop(self, reason: str) -> None:
        """From a thread (never from a signal handler)."""
        if self.stop.is_set():
            return
        self.reason = reason
        self.stop.set()
        for fn in self._on_stop:
            fn()
        self._exit_soon()

    def take_signal(self) -> None:
        """Called by the thread that watches `wake_r` when it becomes readable: each byte is
        the number of a signal that arrived."""
        try:
            got = os.read(self.wake_r, 64)
        except BlockingIOError:
            return
        if signal.SIGTERM in got:
            self.request_stop("SIGTERM")

    def install(self) -> None:
        """From the main thread (set_wakeup_fd must be called there)."""
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, _ignore)
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        if self.parent_pid is not None:
            self.watch_parent(self.parent_pid)

    def watch_parent(self, parent_pid: int) -> None:
        """Never outlive the daemon (it may die by SIGKILL or by the OOM killer)."""
        self.parent_pid = parent_pid
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
            except (OSError, AttributeError):
                pass
            else:
                # The parent may have died before prctl ran: then no signal will ever come.
                if os.getppid() != parent_pid:
                    os.kill(os.getpid(), signal.SIGTERM)
                return
        # Elsewhere (macOS): poll; reparenting changes getppid() when the parent dies.
        threading.Thread(target=self._poll_parent, args=(parent_pid,), daemon=True).start()

    def _poll_parent(self, parent_pid: int) -> None:
        while not self.stop.wait(0.5):
            if os.getppid() != parent_pid:
                self.request_stop("parent gone")


def _ignore(signum: int, frame: FrameType | None) -> None:
    """SIGTERM's Python-level handler: the wakeup fd already carried it to the channel thread."""
