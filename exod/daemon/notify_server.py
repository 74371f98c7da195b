"""The daemon as a notify-socket server: what systemd is to a service, exod is to its runners.

Wire format as sd_notify(3): AF_UNIX SOCK_DGRAM datagrams of newline-separated KEY=VALUE lines.
The sender is identified by SCM_CREDENTIALS (SO_PASSCRED), so a runner cannot speak for another.
File descriptors that arrive (systemd-notify's BARRIER=1 sends one) are closed at once, or the
sender would wait for their closing.
"""

from __future__ import annotations

import array
import asyncio
import os
import socket
import struct
from collections.abc import Callable
from pathlib import Path

from loguru import logger

from exod import trust

SO_PASSCRED = getattr(socket, "SO_PASSCRED", None)
SCM_CREDENTIALS = getattr(socket, "SCM_CREDENTIALS", None)
CREDS = struct.Struct("iII")  # pid, uid, gid
MAX_DATAGRAM = 16384
MAX_FDS = 16

Handler = Callable[[int, dict[str, str]], None]


def parse(data: bytes) -> dict[str, str]:
    """KEY=VALUE lines; lines without '=' are ignored (as systemd does). Last key wins."""
    out: dict[str, str] = {}
    for line in data.decode("utf-8", "replace").split("\n"):
        key, sep, value = line.partition("=")
        if sep and key:
            out[key] = value
    return out


class NotifyServer:
    def __init__(self, path: Path, handler: Handler) -> None:
        self.path = path
        self.handler = handler
        self.sock: socket.socket | None = None

    def open(self, loop: asyncio.AbstractEventLoop) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        if self.path.exists() or self.path.is_symlink():
            self.path.unlink()
        trust.bind_unix(sock, self.path, 0o600)  # runners run as the daemon's user
        if SO_PASSCRED is not None:
            sock.setsockopt(socket.SOL_SOCKET, SO_PASSCRED, 1)
        sock.setblocking(False)
        self.sock = sock
        loop.add_reader(sock.fileno(), self.drain)

    def close(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.sock is not None:
            loop.remove_reader(self.sock.fileno())
            self.sock.close()
            self.sock = None
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass

    def drain(self) -> None:
        """Handle every queued datagram. Also called before an exit is processed, so a runner's
        last words (e.g. X_EXOD_ERROR) are never read after its death."""
        if self.sock is None:
            return
        fd_space = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)
        cred_space = socket.CMSG_SPACE(CREDS.size)
        while True:
            try:
                data, ancdata, _flags, _addr = self.sock.recvmsg(MAX_DATAGRAM,
                                                                  fd_space + cred_space)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                logger.warning("notify socket: {}", e)
                return
            pid = self._sender(ancdata)
            fields = parse(data)
            if pid is None:  # no kernel credentials (macOS): trust the runner's own claim
                try:
                    pid = int(fields.get("X_EXOD_PID", ""))
                except ValueError:
                    logger.warning("notify message without sender credentials, ignored")
                    continue
            try:
                self.handler(pid, fields)
            except Exception:  # noqa: BLE001 -- a bad message must not take the daemon's loop down
                logger.exception("notify handler failed for pid {}", pid)

    @staticmethod
    def _sender(ancdata: list[tuple[int, int, bytes]]) -> int | None:
        pid = None
        for level, kind, payload in ancdata:
            if level != socket.SOL_SOCKET:
                continue
            if kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
                for fd in fds:
                    os.close(fd)
            elif SCM_CREDENTIALS is not None and kind == SCM_CREDENTIALS:
                pid = CREDS.unpack_from(payload)[0]
        return pid
