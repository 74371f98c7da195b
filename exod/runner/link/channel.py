"""The runner's end of its one channel to the daemon (`exod.wire.child_end`), and what it does with
the daemon's messages.

Everything goes through it, as `exod.wire.messages` in `exod.wire.protocol` frames: the runner's
hello, then the daemon's start-up spec (`exod.wire.specs.RunnerSpec`, which `spec()` waits for),
then lifecycle reports and generation events out (`send`, from any thread) and requests in.
Incoming requests land in `inbox` for the main thread, except the ones that must act at once:
`Shutdown` (stop, with the grace its prompt cache may be written in) and `Cancel` (abort one
generation); `ClearCacheWork` queues like a request. End of stream means the daemon is gone:
stop. The same thread watches the signal wakeup pipe (`exod.runner.link.lifecycle`). Without a
channel (a runner started by hand) it only watches for signals, and what would be sent is
dropped.
"""

from __future__ import annotations

import queue
import socket
import time
from collections.abc import Sequence
from typing import Any

from exod.wire import messages as m
from exod.wire.child_end import ChildEnd
from exod.runner.link.lifecycle import Lifecycle
from exod.runner.link.log import ERR, log
from exod.runner.serving.reading import Read
from exod.wire.specs import RUNNER_FIRST, RunnerSpec


class Channel:
    def __init__(self, fd: int | None, life: Lifecycle) -> None:
        self.end: ChildEnd[RunnerSpec] = ChildEnd(fd, RUNNER_FIRST, m.TO_RUNNER)
        self.life = life
        # None wakes the main thread (a stop); requests (Generate, Embed) and ClearCacheWork queue.
        # The serve loop's reader hands requests back here once read
        # (exod.runner.serving.reading).
        self.inbox: queue.Queue[m.Work | m.ClearCacheWork | Read[Any, Any] | None] = queue.Queue()
        self.cancelled: set[str] = set()
        self.drain: float | None = None  # seconds the daemon allows in-flight work to finish
        self.exit_by: float | None = None  # time.monotonic() the grace of a Shutdown ends
        self.broken = ""  # why the channel broke, if it did
        life.on_stop(self._stopped)

    @property
    def sock(self) -> socket.socket | None:
        return self.end.sock

    def start(self) -> None:
        """Say hello (the daemon checks the protocol version), then watch the channel."""
        self.end.start(self._dispatch, self._closed, wake=(self.life.wake_r,
                                                           self.life.take_signal))

    def spec(self, timeout: float | None = None) -> RunnerSpec | None:
        """What this runner is to do, as the daemon said it after the hello; None if a stop, the
        channel's end or `timeout` came first."""
        return self.end.spec(timeout)

    def send(self, msg: m.FromRunner) -> bool:
        return self.end.send(msg)

    def send_all(self, msgs: Sequence[m.FromRunner]) -> bool:
        """Several messages in one write: a batch step's events for every request in it cost
        one system call and one wake-up of the daemon, not one per request."""
        return self.end.send_all(msgs)

    def _closed(self, why: str | None) -> None:
        # The stop first: nothing after it may keep a runner whose daemon is gone alive.
        self.broken = why or ""
        self.life.request_stop("daemon gone (channel closed)")
        if why is not None:
            log(f"channel to exod broken: {why}", ERR)

    def _stopped(self) -> None:
        self.inbox.put(None)
        self.end.give_up()  # a stop before the spec came: nothing to wait for

    def _dispatch(self, msg: m.ToRunner) -> None:
        if isinstance(msg, m.Shutdown):
            self.drain = msg.drain
            if msg.grace > 0:
                self.exit_by = time.monotonic() + msg.grace
            self.life.request_stop("asked by exod")
        elif isinstance(msg, m.Cancel):
            self.cancelled.add(msg.id)
        else:
            self.inbox.put(msg)
