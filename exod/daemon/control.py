"""The control socket that exoctl talks to: newline-delimited JSON over an AF_UNIX stream.

A request is one line, `{"cmd": "status"}` / `{"cmd": "start", "name": "big"}` / … ; the answer is
one line `{"ok": true, …}` or `{"ok": false, "error": "…"}`. `wait` streams `{"event": …}` lines
until its final answer. Every one is a typed message of exod.wire.control: a request is
checked field by field before any command sees it (why lines, not exod.wire.protocol's frames: see
there). The socket file gets `control.mode` (0660 by default) so that a group can
be allowed to drive exod without being root; each client's uid is checked on the connection too
(exod.trust). The request line must arrive within REQUEST_TIMEOUT; at most `max_connections`
are open at once, beyond which the oldest one still silent is dropped.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import socket
import stat
from pathlib import Path
from typing import Any, Protocol

from loguru import logger

from exod.wire import control as cm
from exod import trust
from exod.daemon.ratelog import RateLimitedLog
from exod.wire.protocol import ProtocolError, to_wire

MAX_REQUEST = 64 * 1024
REQUEST_TIMEOUT = 10.0
MAX_CONNECTIONS = 64
SEND_TIMEOUT = 30.0


class SocketInUse(OSError):
    pass


class CommandError(Exception):
    """A command the client got wrong (an unknown instance, an unknown command): its message
    goes back as `{"ok": false, "error": ...}`. Any other exception is a bug, logged as one."""


class Backend(Protocol):
    async def command(self, req: cm.Request, emit: Emit) -> cm.Reply: ...


class Emit(Protocol):
    async def __call__(self, msg: cm.Event) -> None: ...


def prepare_path(path: Path, group_access: bool = True, gid: int | None = None) -> None:
    """Create (or adopt) the private runtime folder and clear a stale socket; refuse if a daemon
    answers, if the folder is someone else's, or if the path holds anything but a socket."""
    trust.ensure_private_dir(path.parent, group_access, gid)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a socket"
        raise OSError(errno.EEXIST, f"control.socket {path} exists and is {kind}: refusing to "
                                    "replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(str(path))
    except OSError:
        path.unlink()  # nobody listens: left over from a daemon that died
        return
    finally:
        probe.close()
    raise SocketInUse(errno.EADDRINUSE, f"{path} is in use: another exod is running")


class ControlServer:
    def __init__(self, path: Path, mode: int, backend: Backend, group: str | None = None,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        self.path = path
        self.mode = mode
        self.backend = backend
        self.group = group
        self.max_connections = max_connections
        self.ratelog = RateLimitedLog()
        self.policy: trust.ClientPolicy | None = None
        self._server: asyncio.AbstractServer | None = None
        self._silent: dict[asyncio.StreamWriter, None] = {}  # no request line yet, oldest first
        self._open = 0

    def gid(self) -> int | None:
        """The group the socket is shared with: control.group, else exod's own group when the
        mode grants the group access."""
        if self.group is not None:
            try:
                return trust.group_gid(self.group)
            except KeyError:
                raise OSError(errno.EINVAL, f"control.group {self.group!r}: no such group") \
                    from None
        return os.getegid() if self.mode & 0o070 else None

    async def start(self) -> None:
        gid = self.gid()
        prepare_path(self.path, group_access=gid is not None,
                     gid=gid if self.group is not None else None)
        self.policy = trust.ClientPolicy(gid)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            trust.bind_unix(sock, self.path, self.mode,
                            gid if self.group is not None else None)
            self._server = await asyncio.start_unix_server(self._serve, sock=sock,
                                                           limit=MAX_REQUEST)
        except BaseException:
            sock.close()
            raise
        logger.info("control socket {}", self.path)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass

    def _admit(self, writer: asyncio.StreamWriter) -> bool:
        """Room for one more connection: drop the oldest silent one at the cap."""
        if self._open >= self.max_connections:
            if not self._silent:
                self.ratelog.warning("control-cap", "control socket: {} connections, all busy: "
                                     "refusing new ones", self._open)
                return False
            oldest = next(iter(self._silent))
            self._silent.pop(oldest)
            oldest.close()
            self.ratelog.warning("control-evict", "control socket: {} connections open: "
                                 "dropping the oldest silent ones", self._open)
        self._open += 1
        self._silent[writer] = None
        return True

    def _allowed(self, writer: asyncio.StreamWriter) -> str | None:
        """None when the client may talk to us, else why not."""
        sock = writer.get_extra_info("socket")
        creds = trust.peer_creds(sock) if sock is not None else None
        if creds is None or self.policy is None or self.policy.allows(*creds):
            return None
        self.ratelog.warning("control-denied", "control socket: refused a client with uid {} "
                             "gid {}", *creds)
        return (f"permission denied: uid {creds[0]} may not use exod's control socket (only "
                "exod's user, root and members of control.group may)")

    async def _run(self, req: cm.Request, reader: asyncio.StreamReader,
                   emit: Emit) -> cm.Reply | None:
        """The command's answer; None when the client left first. A client that leaves a
        `wait` or `watch` ends it at once (else its connection would stay open until the next
        change); other commands finish anyway (an interrupted `exoctl reload` still reloads)."""
        task = asyncio.ensure_future(self.backend.command(req, emit))
        gone = asyncio.ensure_future(reader.read(1))  # nothing more is sent: EOF = gone
        try:
            await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if not task.done():
            if isinstance(req, cm.STREAMING):
                task.cancel()
                return None
            await asyncio.shield(task)
        try:
            return task.result()
        except CommandError as e:
            return cm.Failure(str(e))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async def send(obj: dict[str, Any]) -> None:
            writer.write(json.dumps(obj).encode() + b"\n")
            # A client that stops reading is dropped, not buffered for without end.
            await asyncio.wait_for(writer.drain(), SEND_TIMEOUT)

        async def emit(msg: cm.Event) -> None:
            await send(to_wire(msg, cm.EVENT_TAG))

        async def answer(msg: cm.Reply) -> None:
            await send(to_wire(msg))

        if not self._admit(writer):
            writer.close()
            return
        try:
            denied = self._allowed(writer)
            if denied is not None:
                await answer(cm.Failure(denied))
                return
            try:
                line = await asyncio.wait_for(reader.readline(), REQUEST_TIMEOUT)
            except asyncio.TimeoutError:
                return
            except (ValueError, asyncio.LimitOverrunError):
                await answer(cm.Failure(f"bad request: longer than {MAX_REQUEST} bytes"))
                return
            finally:
                self._silent.pop(writer, None)
            if not line:
                return
            try:
                req = parse_request(line)
            except ProtocolError as e:
                await answer(cm.Failure(f"bad request: {e}"))
                return
            reply = await self._run(req, reader, emit)
            if reply is not None:
                await answer(reply)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                asyncio.TimeoutError):
            pass  # the client went away (exoctl wait interrupted) or stopped reading
        except Exception as e:  # noqa: BLE001 -- a bug in one command must not end the server
            # A bug: with its traceback, but once per cause and interval.
            self.ratelog.log("ERROR", f"control-{type(e).__name__}", "control request failed",
                             exception=e)
        finally:
            self._silent.pop(writer, None)
            self._open -= 1
            writer.close()


def parse_request(line: bytes) -> cm.Request:
    """One request line, checked; ProtocolError says what is wrong with it."""
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError) as e:
        raise ProtocolError("not JSON" if isinstance(e, RecursionError) else str(e)) from None
    if not isinstance(obj, dict):
        raise ProtocolError("a request is a JSON object with a string 'cmd'")
    if not isinstance(obj.get("cmd"), str):
        raise ProtocolError("a request is a JSON object with a string 'cmd'")
    if obj["cmd"] not in cm.REQUESTS:
        raise ProtocolError(f"unknown command {obj['cmd'][:60]!r}")
    return cm.decode_request(obj)
