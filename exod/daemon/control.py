"""The control socket that exoctl talks to: newline-delimited JSON over an AF_UNIX stream.

A request is one line, `{"cmd": "status"}` / `{"cmd": "start", "name": "big"}` / … ; the answer is
one line `{"ok": true, …}` or `{"ok": false, "error": "…"}`. `wait` streams `{"event": …}` lines
until its final answer. The socket file gets `control.mode` (0660 by default) so that a group can
be allowed to drive exod without being root.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import socket
from pathlib import Path
from typing import Any, Protocol

from loguru import logger

MAX_REQUEST = 64 * 1024


class SocketInUse(OSError):
    pass


class CommandError(Exception):
    """A command the client got wrong (an unknown instance, an unknown command): its message
    goes back as `{"ok": false, "error": ...}`. Any other exception is a bug, logged as one."""


class Backend(Protocol):
    async def command(self, cmd: str, req: dict[str, Any],
                      emit: Emit) -> dict[str, Any]: ...


class Emit(Protocol):
    async def __call__(self, msg: dict[str, Any]) -> None: ...


def prepare_path(path: Path) -> None:
    """Create the runtime folder (0750) and clear a stale socket; refuse if a daemon answers."""
    path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
    if not (path.exists() or path.is_symlink()):
        return
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
    def __init__(self, path: Path, mode: int, backend: Backend) -> None:
        self.path = path
        self.mode = mode
        self.backend = backend
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        prepare_path(self.path)
        self._server = await asyncio.start_unix_server(self._serve, str(self.path),
                                                       limit=MAX_REQUEST)
        os.chmod(self.path, self.mode)
        logger.info("control socket {}", self.path)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async def emit(msg: dict[str, Any]) -> None:
            writer.write(json.dumps(msg).encode() + b"\n")
            await writer.drain()

        try:
            line = await reader.readline()
            if not line:
                return
            try:
                req = json.loads(line)
                if not isinstance(req, dict) or not isinstance(req.get("cmd"), str):
                    raise ValueError("a request is a JSON object with a string 'cmd'")
            except ValueError as e:
                await emit({"ok": False, "error": f"bad request: {e}"})
                return
            try:
                answer = await self.backend.command(req["cmd"], req, emit)
            except CommandError as e:
                answer = {"ok": False, "error": str(e)}
            await emit(answer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # the client went away (exoctl wait interrupted): nothing to tell
        except Exception:  # noqa: BLE001 -- a bug in one command must not end the control server
            logger.exception("control request failed")
        finally:
            writer.close()
