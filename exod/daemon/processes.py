"""The table of live runner processes: spawn, output capture, channel, reaping.

Children are reaped from the event loop on SIGCHLD (waitpid per known pid, WNOHANG). Before an
exit is reported, the runner's last notify datagrams and output are read, so its final words
(e.g. the reason it could not load) are logged before its death is.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from loguru import logger

from exod.core.exits import ExitInfo
from exod.daemon import spawn as os_seam
from exod.daemon.link import Link
from exod.daemon.logs import split_priority

MAX_LINE = 64 * 1024

ExitHandler = Callable[[int, ExitInfo], None]
LineSink = Callable[[dict[str, object], str, str], None]  # (context, level, text)


@dataclass
class Proc:
    child: os_seam.Child
    context: dict[str, object]  # instance, rank: bound to every line the runner prints
    on_exit: ExitHandler
    link: Link  # the channel, framed: the shutdown ask and generation requests go through it
    partial: dict[int, bytes] = field(default_factory=dict)


class ProcessTable:
    def __init__(self, loop: asyncio.AbstractEventLoop, before_exit: Callable[[], None],
                 on_line: LineSink | None = None) -> None:
        self.loop = loop
        self._on_line = on_line  # e.g. the in-memory rings `exoctl logs` reads
        self.procs: dict[int, Proc] = {}
        self._before_exit = before_exit  # drains the notify socket
        self._empty_waiters: list[asyncio.Future[None]] = []

    def install(self) -> None:
        self.loop.add_signal_handler(signal.SIGCHLD, self.reap)

    def spawn(self, module: str, args: list[str], env: Mapping[str, str],
              context: dict[str, object], on_exit: ExitHandler) -> int:
        child = os_seam.spawn(args, env, module)
        ctx = {**context, "pid": child.pid}
        proc = Proc(child, ctx, on_exit, Link(self.loop, child.channel, ctx))
        self.procs[child.pid] = proc
        for fd in (child.stdout, child.stderr):
            proc.partial[fd] = b""
            self.loop.add_reader(fd, self._read, proc, fd)
        # The child may have died before we registered it: SIGCHLD would already be spent.
        self.loop.call_soon(self.reap)
        return child.pid

    def send(self, pid: int, msg: dict[str, object]) -> bool:
        proc = self.procs.get(pid)
        return proc is not None and proc.link.send(msg)

    def link(self, pid: int) -> Link | None:
        proc = self.procs.get(pid)
        return proc.link if proc is not None and not proc.link.closed else None

    def kill(self, pid: int, sig: int) -> bool:
        if pid not in self.procs:
            return False
        return os_seam.send_signal(pid, sig)

    def reap(self) -> None:
        for pid in list(self.procs):
            info = os_seam.reap(pid)
            if info is None:
                continue
            proc = self.procs.pop(pid)
            proc.link.close(f"the runner exited mid-request ({info})")
            self._before_exit()
            self._close(proc)
            proc.on_exit(pid, info)
        if not self.procs:
            for fut in self._empty_waiters:
                if not fut.done():
                    fut.set_result(None)
            self._empty_waiters.clear()

    async def wait_empty(self) -> None:
        if self.procs:
            fut: asyncio.Future[None] = self.loop.create_future()
            self._empty_waiters.append(fut)
            await fut

    # ---- output ------------------------------------------------------------------------
    def _read(self, proc: Proc, fd: int) -> None:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            self._feed(proc, fd, data)
        else:
            self._eof(proc, fd)

    def _feed(self, proc: Proc, fd: int, data: bytes) -> None:
        *lines, rest = (proc.partial[fd] + data).split(b"\n")
        if len(rest) > MAX_LINE:  # a runaway line without a newline: log it in pieces
            lines.append(rest)
            rest = b""
        proc.partial[fd] = rest
        for line in lines:
            self._log_line(proc, line)

    def _eof(self, proc: Proc, fd: int) -> None:
        if fd not in proc.partial:
            return
        self.loop.remove_reader(fd)
        rest = proc.partial.pop(fd)
        if rest:
            self._log_line(proc, rest)
        os.close(fd)

    def _log_line(self, proc: Proc, raw: bytes) -> None:
        level, text = split_priority(raw.decode("utf-8", "replace").rstrip("\r"))
        logger.bind(**proc.context).log(level, "| {}", text)
        if self._on_line is not None:
            self._on_line(proc.context, level, text)

    def _close(self, proc: Proc) -> None:
        """After the exit: log what is left in the pipes, then close everything."""
        for fd in list(proc.partial):
            while fd in proc.partial:
                try:
                    data = os.read(fd, 65536)
                except BlockingIOError:
                    data = b""  # nothing more now (a grandchild may hold the pipe): stop here
                except OSError:
                    data = b""
                if data:
                    self._feed(proc, fd, data)
                else:
                    self._eof(proc, fd)
        proc.child.channel.close()
