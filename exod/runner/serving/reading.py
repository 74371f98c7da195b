"""Requests are read (chat template, tokenizer, checks) on a thread of their own, in the order
they came, while the serve loop goes on stepping the batch.

Reading a body of megabytes takes seconds. Done between two steps of the batch, it stood every
stream still for that long, and a stop that came meanwhile waited for it: a bigger body would
have outlasted the stop's grace and met SIGTERM. Off the loop's thread, neither waits: the loop
steps the batch, takes cancels and stops, and admits each request once its prompt is read.

A request is `pending` from `submit` until the loop `take`s its result (or `drop`s it: its
client left, or the instance is stopping). A dropped request may still be under the tokenizer:
its result is thrown away when it comes. While one is read, `say(id)` runs every `every` seconds
(exod.runner.serving.busy_notice), so the daemon's hang watch hears that it is being read.

A `quick` request (a short text, nothing compiled for it) takes little time to read:
the loop may `read_now` on its own thread, saving two thread hand-offs of its time to first
token (docs/design/hop.md).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from exod.wire import messages as m
from exod.runner.serving.busy_notice import Meanwhile


@dataclass(frozen=True)
class Prompt:
    """A request's prompt as read: its tokens, checked against the model, and the max_tokens
    that fits the window. No mlx object: it is read on the reader's thread."""

    tokens: list[int]
    max_tokens: int
    constraint: Any = None  # its grammar, compiled (exod.runner.serving.grammar.Constraint)
    # Its strict tools, compiled (exod.runner.serving.strict_args.ArgsCheck), or None.
    args_check: Any = None
    # Its context edits that changed the prompt, for its Done (exod.core.context_edits).
    applied_edits: list[dict[str, Any]] = field(default_factory=list)


# The text a `quick` request may have at most (characters of its turns or prompt).
QUICK_CHARS = 8192

Req = TypeVar("Req", bound=m.Work)  # what an engine takes: Generate, or Embed
P = TypeVar("P")  # what it reads of one: a Prompt, or an embedding engine's inputs


@dataclass(frozen=True)
class Read(Generic[Req, P]):
    """A request, read: its prompt, or why it cannot be served (raised by the reading)."""

    req: Req
    prompt: P | None
    error: Exception | None


def quick(req: m.Work) -> bool:
    """A generation whose reading is bounded by a short text: no pictures, tools, schema, think
    budget or context edits (what may compile a grammar, or render the template many times)."""
    if not isinstance(req, m.Generate) or req.images or req.tools or req.response_format \
            or req.context_edits or req.think_budget is not None:
        return False
    size = len(req.prompt or "")
    for msg in req.messages or []:
        if len(msg) > 2:  # more than role and content: an assistant's calls, a tool's id
            return False
        content = msg.get("content")
        size += len(content) if isinstance(content, str) else QUICK_CHARS + 1
    return size <= QUICK_CHARS


class Reader(Generic[Req, P]):
    def __init__(self, read: Callable[[Req], P], done: Callable[[Read[Req, P]], None],
                 say: Callable[[str], object], every: float) -> None:
        self._read, self._done, self._say = read, done, say
        self._meanwhile = Meanwhile(every)
        self._queue: queue.SimpleQueue[Req] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        # Touched by both threads: set operations are atomic under the GIL, and the one that
        # decides (`take`) runs on the loop's thread only.
        self.pending: set[str] = set()

    def submit(self, req: Req) -> None:
        if self._thread is None:  # started on first use: a runner that only loads has none
            self._thread = threading.Thread(target=self._run, name="exod-reader", daemon=True)
            self._thread.start()
        self.pending.add(req.id)
        self._queue.put(req)

    def take(self, read: Read[Req, P]) -> bool:
        """True when `read` is still wanted (then it is no longer pending)."""
        if read.req.id not in self.pending:
            return False
        self.pending.discard(read.req.id)
        return True

    def drop(self, rid: str) -> bool:
        """Forget a pending request; True if it was pending."""
        if rid not in self.pending:
            return False
        self.pending.discard(rid)
        return True

    def read_now(self, req: Req) -> Read[Req, P]:
        """Read `req` on the caller's thread (a `quick` one: no progress is said); it is never
        pending."""
        try:
            return Read(req, self._read(req), None)
        except Exception as e:  # noqa: BLE001 -- the loop turns it into the client's error
            return Read(req, None, e)

    def drop_all(self) -> list[str]:
        dropped, self.pending = sorted(self.pending), set()
        return dropped

    def _run(self) -> None:
        while True:
            req = self._queue.get()
            if req.id in self.pending:  # not dropped before its turn
                self._done(self._read_one(req))

    def _read_one(self, req: Req) -> Read[Req, P]:
        def say() -> None:
            if req.id in self.pending:  # a dropped request's client has heard the end of it
                self._say(req.id)

        try:
            with self._meanwhile.busy(say):
                return self.read_now(req)
        except Exception as e:  # noqa: BLE001 -- what `say` raised (PeerLost): the client's error
            return Read(req, None, e)
