"""One question to a short-lived child process (the split probe, a fetcher asked for a plan), on
the same kind of channel as a runner's, with the same typed, versioned, checked messages.

`python -m MODULE --channel-fd N` (in safe-path mode, in exod's own folder: exod.child_start):
the child says `Hello` (its version must be ours), gets the
question as its first frame (`exod.wire.specs`), and answers with one message of `answers`; what it
says before that (`meanwhile`, e.g. a fetcher's status) is checked and passed over. Anything
else, a child of another version, a child that dies or says nothing in time: `NoAnswer`, with
the reason in one line. The child's output goes nowhere (mlx-lm prints as it likes), and its
answer cannot be mixed up with it. Blocking: `exod check` asks, and the config loader, which
the daemon runs off its event loop.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from exod.wire import messages as m
from exod.child_start import explicit_path, helper_dir, python_argv
from exod.wire.protocol import FrameDecoder, ProtocolError, encode, from_wire, to_wire

EXIT_WAIT = 5.0  # once it answered, the child exits at once (its channel closes)


class NoAnswer(Exception):
    pass


class _Frames:
    """The child's frames, one at a time, until `deadline`."""

    def __init__(self, sock: socket.socket, deadline: float, module: str) -> None:
        self.sock, self.deadline, self.module = sock, deadline, module
        self.decoder = FrameDecoder()
        self.ready: list[dict[str, Any]] = []

    def next(self) -> dict[str, Any]:
        while not self.ready:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise NoAnswer(f"{self.module} gave no answer in time")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError as e:
                raise NoAnswer(f"{self.module}: {e}") from None
            if not data:
                raise NoAnswer(f"{self.module} exited without an answer")
            self.ready += self.decoder.feed(data)
        return self.ready.pop(0)


def ask(module: str, question: Any, answers: Mapping[str, type[Any]], timeout: float,
        env: Mapping[str, str] | None = None,
        meanwhile: Mapping[str, type[Any]] | None = None, cwd: Path | None = None) -> Any:
    """The child's answer to `question`, one of `answers`; NoAnswer otherwise. It runs in
    `cwd`, by default exod's cache folder (exod.child_start.helper_dir)."""
    deadline = time.monotonic() + timeout
    where = cwd if cwd is not None else helper_dir()
    ours, theirs = socket.socketpair()
    try:
        proc = subprocess.Popen(
            python_argv(module, ["--channel-fd", str(theirs.fileno())], where),
            pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, cwd=where,
            env=explicit_path(os.environ if env is None else env))
    except OSError as e:
        ours.close()
        raise NoAnswer(f"cannot start {module}: {e}") from None
    finally:
        theirs.close()
    answered = False
    try:
        frames = _Frames(ours, deadline, module)
        hello = from_wire(frames.next(), {m.Hello.type: m.Hello})
        if hello.version != m.VERSION:
            raise NoAnswer(f"{module} speaks protocol version {hello.version}, this is "
                           f"{m.VERSION} (a stale install?)")
        ours.sendall(encode(to_wire(question)))
        allowed = {**(meanwhile or {}), **answers}
        while True:
            msg = from_wire(frames.next(), allowed)
            if msg.type in answers:
                answered = True
                return msg
    except ProtocolError as e:
        raise NoAnswer(f"{module}: {e}") from None
    except OSError as e:
        raise NoAnswer(f"{module}: {e}") from None
    finally:
        ours.close()
        try:
            proc.wait(EXIT_WAIT if answered else 0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
