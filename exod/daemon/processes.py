"""The table of live runner processes: spawn, output capture, channel, reaping.

Children are reaped from the event loop on SIGCHLD (waitpid per known pid, WNOHANG). A reaped
runner leaves the table at once (so it is never signalled again: its pid may be reused), but its
exit is reported only after its channel and its output pipes have been read to the end, so its
last words (e.g. the reason it could not load) arrive before its death does. Output and channel
are asyncio streams with explicit limits: a line longer than MAX_LINE is logged in pieces.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from loguru import logger

from exod.wire import messages as m
from exod.core.exits import ExitInfo
from exod.daemon import spawn as os_seam
from exod.daemon.channel import RunnerChannel
from exod.daemon.launch import Launch
from exod.daemon.logs import split_priority
from exod.daemon.zygote import Zygote

MAX_LINE = 64 * 1024
# How long a reaped runner's pipes may take to reach end of stream: a grandchild that inherited
# them could hold them open for ever, and the exit must still be reported.
EXIT_DRAIN = 2.0
# A runner says hello before it imports anything heavy (mlx), so a long silence is a runner
# that will never speak: without this deadline it would sit in `starting` for ever.
HELLO_DEADLINE = 60.0

ExitHandler = Callable[[int, ExitInfo], None]
M = TypeVar("M")


LineSink = Callable[[dict[str, object], str, str], None]  # (context, level, text)

@dataclass
class RunnerHandlers(Generic[M]):
    """What the table reports about one child (a runner, or a fetcher: M is what it says), to
    its owner."""

    on_exit: ExitHandler
    on_message: Callable[[int, M], None]
    on_broken: Callable[[int, str], None]  # protocol error: end it through the ladder


@dataclass
class Proc:
    child: os_seam.Child
    context: dict[str, object]  # instance, rank, pid: bound to every line the runner prints
    handlers: RunnerHandlers[Any]
    link: RunnerChannel[Any]  # the channel: lifecycle reports, requests and their events
    readers: list[asyncio.Task[None]] = field(default_factory=list)


class ProcessTable:
    def __init__(self, loop: asyncio.AbstractEventLoop, on_line: LineSink | None = None) -> None:
        self.loop = loop
        self._on_line = on_line  # e.g. the in-memory rings `exoctl logs` reads
        self.procs: dict[int, Proc] = {}
        self._finishing: set[asyncio.Task[None]] = set()
        self._empty_waiters: list[asyncio.Future[None]] = []
        self.zygote: Zygote | None = None  # set by the owner where runners may be forked

    def install(self) -> None:
        self.loop.add_signal_handler(signal.SIGCHLD, self.reap)

    def spawn(self, launch: Launch[M], context: dict[str, object],
              handlers: RunnerHandlers[M]) -> int:
        """Start `launch`'s child; its spec goes first on its channel once it says hello."""
        child = self._start(launch)
        pid = child.pid
        ctx = {**context, "pid": pid}
        link = RunnerChannel(child.channel, ctx, launch.spec, launch.decode,
                             lambda msg: handlers.on_message(pid, msg),
                             lambda why: handlers.on_broken(pid, why))
        proc = Proc(child, ctx, handlers, link)
        proc.readers = [self.loop.create_task(self._read_lines(proc, fd))
                        for fd in (child.stdout, child.stderr)]
        self.procs[pid] = proc
        link.reader_task.add_done_callback(lambda _: self.loop.call_later(
            EXIT_DRAIN, self._channel_gone, proc))
        self.loop.call_later(HELLO_DEADLINE, self._hello_due, proc)
        # The child may have died before we registered it: SIGCHLD would already be spent.
        self.loop.call_soon(self.reap)
        return pid

    def _start(self, launch: Launch[M]) -> os_seam.Child:
        """Forked from the zygote where the launch fits it, else exec'd."""
        z = self.zygote
        if z is not None and z.fits(launch.env, launch.module):
            z.start(self.loop)  # the first that fits starts it (runners exec'd meanwhile)
            child = z.fork(launch.env)
            if child is not None:
                return child
        return os_seam.spawn(launch.env, launch.module, launch.cwd)

    def send(self, pid: int, msg: m.ToRunner) -> bool:
        proc = self.procs.get(pid)
        return proc is not None and proc.link.send(msg)

    def link(self, pid: int) -> RunnerChannel[Any] | None:
        proc = self.procs.get(pid)
        return proc.link if proc is not None and not proc.link.closed else None

    def _channel_gone(self, proc: Proc) -> None:
        """The channel ended some time ago and the runner is still not reaped: it closed its
        channel but kept running, so it can no longer be asked anything. It is broken."""
        pid = proc.child.pid
        if self.procs.get(pid) is not proc or proc.link.broken:
            return  # it exited, as a runner whose channel ends should; or already reported
        why = "the runner closed its channel but kept running"
        logger.bind(**proc.context).error("{}", why)
        proc.handlers.on_broken(pid, why)

    def _hello_due(self, proc: Proc) -> None:
        pid = proc.child.pid
        if self.procs.get(pid) is not proc or proc.link.hello is not None or proc.link.closed:
            return
        why = f"the runner said no hello within {HELLO_DEADLINE:g}s"
        logger.bind(**proc.context).error("{}", why)
        proc.handlers.on_broken(pid, why)

    def kill(self, pid: int, sig: int) -> bool:
        if pid not in self.procs:
            return False
        return os_seam.send_signal(pid, sig)

    def reap(self) -> None:
        for pid in list(self.procs):
            self._reap(pid)
        self._reap_strays()

    def _reap(self, pid: int) -> None:
        info = os_seam.reap(pid)
        if info is None:
            return
        task = self.loop.create_task(self._finish(self.procs.pop(pid), info))
        self._finishing.add(task)
        task.add_done_callback(self._finished)

    def _reap_strays(self) -> None:
        """Children that are not in the table: the zygote, a runner it forked too late to be
        used, or any descendant orphaned to the daemon as their subreaper (exod.daemon.zygote).
        A child in the daemon's own process group was started by other code of the daemon's
        (a subprocess), which waits for it itself: it is left alone."""
        kids = os_seam.children()
        if kids is not None:  # each one looked at: one left alone never hides the rest
            for pid in kids:
                if pid not in self.procs:
                    os_seam.reap_stray(pid)
            return
        while True:  # elsewhere: the exited ones, until one is left alone
            found = os_seam.waitable()
            if found is None:
                return
            if found in self.procs:
                self._reap(found)  # it exited after the loop above looked
            elif not os_seam.reap_stray(found):
                return

    async def _finish(self, proc: Proc, info: ExitInfo) -> None:
        """Read what the dead runner left in its channel and pipes, then report its exit."""
        pending = [*proc.readers, proc.link.reader_task]
        _, late = await asyncio.wait(pending, timeout=EXIT_DRAIN)
        for task in late:
            task.cancel()
        proc.link.close(f"the runner exited mid-request ({info})")
        proc.child.channel.close()
        proc.handlers.on_exit(proc.child.pid, info)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._finishing.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.opt(exception=task.exception()).error("handling a runner's exit failed")
        if not self.procs and not self._finishing:
            for fut in self._empty_waiters:
                if not fut.done():
                    fut.set_result(None)
            self._empty_waiters.clear()

    async def wait_empty(self) -> None:
        if self.procs or self._finishing:
            fut: asyncio.Future[None] = self.loop.create_future()
            self._empty_waiters.append(fut)
            await fut

    # ---- output ------------------------------------------------------------------------
    async def _read_lines(self, proc: Proc, fd: int) -> None:
        reader = asyncio.StreamReader(limit=MAX_LINE, loop=self.loop)
        transport, _ = await self.loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0))
        try:
            while True:
                try:
                    line = await reader.readuntil(b"\n")
                except asyncio.LimitOverrunError:
                    line = await reader.read(MAX_LINE)  # a runaway line: log it in pieces
                except asyncio.IncompleteReadError as e:
                    if e.partial:
                        self._log_line(proc, e.partial)
                    return
                self._log_line(proc, line.rstrip(b"\n"))
        finally:
            transport.close()

    def _log_line(self, proc: Proc, raw: bytes) -> None:
        level, text = split_priority(raw.decode("utf-8", "replace").rstrip("\r"))
        logger.bind(**proc.context).log(level, "| {}", text)
        if self._on_line is not None:
            self._on_line(proc.context, level, text)
