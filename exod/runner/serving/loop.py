"""The runner's serve loop: generation requests from the daemon, driven through an engine.

The engine owns the generations (`exod.runner.serving.batch_engine.BatchEngine`; on rank 0 of a
group, `exod.runner.group.lockstep.LeaderEngine`, which also tells the other ranks what to
replay); the loop owns the channel. New requests are read (templated, tokenized, checked) on a
thread of their own (exod.runner.serving.reading), so a body of megabytes stands neither the
batch nor a stop still; a quick one, while no stream would wait for it, is read on the loop's
own thread (no hand-off to wait for: docs/design/hop.md). Between two engine steps, the loop
admits the requests read by then, drops cancelled ones and, once asked to stop, lets in-flight
work finish until the drain deadline, then ends it with an error event and returns (the runner
then exits 0). A step is bounded, so a stop is always answered within the ladder's rung 1, even
during a long prompt; the prompt cache's writes to disk fit there too (the engine's `idle`
whenever nothing is in flight, then `save_cache` until `flush_deadline`). The heartbeat goes to
the daemon from this loop, so a stuck loop stops sending it (`tick`: rank 0's group heartbeat
too). `expect` tells the engine how many requests are still being read (the vision engine holds
a burst for them).
"""

from __future__ import annotations

import collections
import dataclasses
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Generic, Protocol, TypeVar

from exod.wire import messages as m
from exod.core.request_rules import RequestError, WindowExceeded
from exod.runner.link.channel import Channel
from exod.runner.link.lifecycle import Lifecycle
from exod.runner.link.log import ERR, log
from exod.runner.serving.reading import Prompt, Read, Reader, quick
from exod.runner.link.report import Reporter, status

# What the loop's thread is handed: a request, a request read, a cache to clear, or a stop's
# wake-up.
Inbox = m.Work | m.ClearCacheWork | Read[Any, Any] | None
R = TypeVar("R", bound=m.Work)  # the requests an engine takes
R_in = TypeVar("R_in", bound=m.Work, contravariant=True)
P = TypeVar("P")  # what it reads of one (a Prompt for text)
# What a text engine's loop answers a request it cannot take.
SERVES_TEXT = "this instance serves chat and completions, not embeddings or reranking"


# How often a request being read is reported (hang_after is at least 1s).
READING_EVERY = 0.4
# The stop's prompt cache flush ends this long before the grace does: room for the exit itself.
EXIT_ROOM = 0.5
# A stop that said no grace (SIGTERM, the daemon gone): this long for the flush, after the drain.
FLUSH_UNASKED = 1.0


class Engine(Protocol[R_in, P]):
    @property
    def active(self) -> int:
        """Generations admitted and not finished."""
        ...

    def read(self, req: R_in) -> P:
        """Its prompt read and checked (RequestError if it cannot be served as given). Called
        on the reader's thread: it must not touch mlx or the engine's state."""
        ...

    def admit(self, req: R_in, prompt: P) -> object:
        """Take a request read by `read`; raises RequestError when it cannot be served."""
        ...

    @property
    def background(self) -> bool:
        """Work of its own to step with no request in flight (a warm-up)."""
        ...

    def idle(self) -> None:
        """Nothing in flight: a moment for work behind the requests (the cache to disk)."""
        ...

    def save_cache(self, deadline: float) -> None:
        """The stop, after the drain: keep what can be kept until `deadline`, never later."""
        ...

    def clear_cache(self) -> None: ...

    def cancel(self, rid: str) -> None: ...

    def expect(self, reading: int) -> bool:
        """`reading` requests are being read, to be admitted soon (on the loop's thread, after
        each take). True: the engine would rather wait for them than step now (the loop then
        waits for the inbox)."""
        ...

    def step(self) -> list[m.Event]:
        """One bounded unit of work (a token, or a prefill chunk) and the events it produced."""
        ...

    def abort_all(self, code: m.ErrorCode, message: str) -> list[m.Event]: ...

    def abort_prefilling(self, code: m.ErrorCode, message: str) -> list[m.Event]:
        """End the generations that have not produced a token yet (still in their prompt)."""
        ...

    def serving(self) -> m.ServingReport:
        """The engine's figures for the daemon (batching, width, prompt cache)."""
        ...


class AsItComes:
    """The Engine's `expect` for an engine that starts each request as it is admitted (all but
    the vision engine, which holds a burst's first requests for the rest while they are read:
    exod.runner.vision.engine)."""

    def expect(self, reading: int) -> bool:
        return False


class NoPromptCache:
    """The Engine's prompt cache methods for an engine that keeps none (mlx-lm's turn path), or
    none on disk (the vision engine, whose RAM entries its own `clear_cache` empties): nothing
    to warm, nothing behind the requests, nothing to keep at the stop."""

    background = False

    def warm(self, tokens: list[int]) -> bool:
        return False  # nothing to prefill into

    def idle(self) -> None:
        pass

    def save_cache(self, deadline: float) -> None:
        pass

    def clear_cache(self) -> None:
        pass


@dataclass
class Ticker:
    """Something to run at least every `every` seconds from the loop."""

    fn: Callable[[], None]
    every: float
    due: float = 0.0

    def poll(self, now: float) -> None:
        if now >= self.due:
            self.fn()
            self.due = time.monotonic() + self.every


class ServeLoop(Generic[R, P]):
    """`takes`: the kind of request the engine serves; another kind is answered `refusal`."""

    def __init__(self, engine: Engine[R, P], channel: Channel, life: Lifecycle, report: Reporter,
                 heartbeat_every: float, tick: Ticker | None = None,
                 takes: type[R] = m.Generate,  # type: ignore[assignment]
                 refusal: str = SERVES_TEXT) -> None:
        self.engine = engine
        self.takes, self.refusal = takes, refusal
        self.channel = channel
        self.life = life
        self.report = report
        self.tickers = [Ticker(report.heartbeat, heartbeat_every), *([tick] if tick else [])]
        self.deadline: float | None = None  # end of the drain, once asked to stop
        self.shown = (-1, -1)  # (requests, of which being read) in the last status report
        self.figures: m.ServingReport | None = None  # the engine's, as last sent
        self.live: set[str] = set()
        self.recent: collections.deque[str] = collections.deque(maxlen=256)  # finished ids
        self.edited: dict[str, list[dict[str, Any]]] = {}  # a live request's applied edits
        self.expecting = False  # the engine waits for the requests being read (`expect`)
        # Admitted since the last step: while every live request is, none has a stream yet.
        self.unstepped: set[str] = set()
        self.reader: Reader[R, P] = Reader(engine.read, channel.inbox.put,
                                           lambda rid: channel.send(m.Prefill(rid, 0, 0)),
                                           READING_EVERY)

    def run(self) -> None:
        while True:
            if self.life.stop.is_set() and self.deadline is None:
                self.deadline = time.monotonic() + (self.channel.drain or 0.0)
                # The drain is for streams under way: a prompt not read yet may need minutes
                # of prefill, which no drain covers, so it ends now.
                why = (f"aborted: the instance is stopping ({self.life.reason}) before this "
                       f"request's prompt was read")
                self._emit(self.engine.abort_prefilling("aborted", why))
                self._emit([m.Error(rid, "aborted", why) for rid in self.reader.drop_all()])
            self._take()
            if self._drain_over():
                return
            self._cancel()
            self.channel.send_all(self._show())
            stepping = (self.live or self.engine.background) and not self.expecting
            # The status again (the loop may next block for a long time with nothing to do), in
            # the step's write: one wake-up of the daemon, not two.
            self._emit(self._step() if stepping else [], show=True)
            now = time.monotonic()
            for t in self.tickers:
                t.poll(now)

    # ---- pieces of one turn ------------------------------------------------------------------
    def flush_deadline(self) -> float:
        return flush_deadline(self.channel)

    def _take(self) -> None:
        idle = not self.live and self.deadline is None and not self.engine.background
        if idle:
            self.engine.idle()
        # Requests being read and nothing else to step (a model that sees holds a burst's
        # first requests for the rest): wait for a read, as when idle.
        block = idle or (self.expecting and self.deadline is None)
        wake = min(t.every for t in self.tickers)
        for item in _drain_queue(self.channel.inbox, block, wake):
            if item is None:
                continue  # a stop's wake-up
            if isinstance(item, m.ClearCacheWork):
                self.engine.clear_cache()
                continue
            if isinstance(item, Read):
                if self.reader.take(item):  # not dropped (cancelled, stopping) meanwhile
                    self._admit(item)
            elif item.id in self.channel.cancelled:  # the client left while it was on its way
                self.channel.cancelled.discard(item.id)
            elif self.life.stop.is_set():
                self._emit([m.Error(item.id, "stopping", "the instance is stopping")])
            elif not isinstance(item, self.takes):  # the daemon refuses it first, by role
                self._emit([m.Error(item.id, "bad_request", self.refusal)])
            else:
                self._read(item)
        self.expecting = self.engine.expect(len(self.reader.pending))

    def _read(self, req: R) -> None:
        """A quick request is read here and now when no stream would stand still meanwhile
        (every live request is still unstepped) and none waits to be read before it; any other
        goes to the reader's thread."""
        if quick(req) and not self.reader.pending and self.live <= self.unstepped:
            self._admit(self.reader.read_now(req))
        else:
            self.reader.submit(req)

    def _admit(self, read: Read[R, P]) -> None:
        rid = read.req.id
        try:
            if read.error is not None:
                raise read.error
            assert read.prompt is not None
            prompt = read.prompt
            if isinstance(prompt, Prompt) and prompt.applied_edits:  # its Done reports them
                self.edited[rid] = prompt.applied_edits
            if isinstance(prompt, Prompt) and isinstance(read.req, m.Generate) \
                    and read.req.count_only:  # counted once read: nothing reaches the engine
                self._emit([m.Done(rid, "stop", len(prompt.tokens), 0)])
                return
            self.engine.admit(read.req, read.prompt)
        except Exception as e:  # noqa: BLE001 -- e.g. a chat template that rejects the roles
            why = str(e) if isinstance(e, RequestError) else f"{type(e).__name__}: {e}"
            param = e.param if isinstance(e, RequestError) else None
            if isinstance(e, WindowExceeded):
                self._emit([m.Error(rid, "context_length_exceeded", why, param, e.prompt,
                                    e.window, e.own)])
            else:
                self._emit([m.Error(rid, "bad_request", why, param)])
            return
        self.live.add(rid)
        self.unstepped.add(rid)

    def _drain_over(self) -> bool:
        if self.deadline is None or (self.live and time.monotonic() < self.deadline):
            return False
        self._emit(self.engine.abort_all(
            "aborted", f"aborted: the instance is stopping ({self.life.reason}; drain of "
                       f"{self.channel.drain or 0:g}s is over)"))
        return True

    def _cancel(self) -> None:
        cancelled = self.channel.cancelled
        for rid in cancelled & self.live:
            self.engine.cancel(rid)
            self.live.discard(rid)
            cancelled.discard(rid)
        for rid in cancelled & self.reader.pending:  # still being read: thrown away when read
            self.reader.drop(rid)
            cancelled.discard(rid)
        for rid in cancelled.intersection(self.recent):  # cancels that crossed a `done`
            cancelled.discard(rid)

    def _step(self) -> list[m.Event]:
        self.unstepped.clear()
        try:
            return self.engine.step()
        except Exception as e:  # noqa: BLE001 -- mlx raises many types: fail the work, go on
            log(f"generation step failed: {type(e).__name__}: {e}", ERR)
            return self.engine.abort_all("internal", f"{type(e).__name__}: {e}")

    def _emit(self, events: list[m.Event], show: bool = False) -> None:
        """Send `events` (and, `show`: the status they leave, in the same write)."""
        if self.edited:
            events = [replace(ev, applied_edits=self.edited.pop(ev.id))
                      if isinstance(ev, m.Done) and ev.id in self.edited else ev for ev in events]
        for ev in events:
            if isinstance(ev, (m.Done, m.Error)):  # the end of that request
                self.edited.pop(ev.id, None)
                self.live.discard(ev.id)
                self.recent.append(ev.id)
                self.channel.cancelled.discard(ev.id)
        self.channel.send_all([*events, *(self._show() if show else ())])

    def _show(self) -> list[m.FromRunner]:
        """Status for the rank when the number of generations changed, and the engine's
        figures whenever they did (a request came or went, the cache was written to disk): what
        to send. Called twice a step, so it makes one report and compares it as it is."""
        reading = len(self.reader.pending)
        n = len(self.live) + reading
        report = self.engine.serving()
        # Not for the draft model's counts alone: they change with every token.
        figures = dataclasses.replace(report, drafted=0, draft_accepted=0) \
            if report.drafted or report.draft_accepted else report
        out: list[m.FromRunner] = []
        if figures != self.figures or (n, reading) != self.shown:
            self.figures = figures
            out.append(report)
        # Both counts: a request read and admitted leaves n as it was.
        if (n, reading) != self.shown:
            self.shown = (n, reading)
            if n:
                text = f"serving {n} request(s)" + (f", reading {reading}" if reading else "")
                out.append(status(m.Phase.SERVING, text, active=n))
            else:
                out.append(status(m.Phase.READY))
        return out


def flush_deadline(channel: Channel) -> float:
    """When the stop's cache flush must end: the grace the daemon gave, less room for the exit
    (a stop that gave none: FLUSH_UNASKED from now)."""
    if channel.exit_by is None:
        return time.monotonic() + FLUSH_UNASKED
    return channel.exit_by - EXIT_ROOM


def _drain_queue(inbox: queue.Queue[Inbox], block: bool, timeout: float) -> list[Inbox]:
    """Everything waiting in the inbox; when `block`, wait for at least one message first."""
    out: list[Inbox] = []
    try:
        if block:
            out.append(inbox.get(timeout=timeout))
        while True:
            out.append(inbox.get_nowait())
    except queue.Empty:
        pass
    return out
