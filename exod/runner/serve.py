"""The runner's serve loop: generation requests from the daemon, one bounded engine step at a time.

The engine does the generating (exod.runner.engine: continuous batching on a single rank;
exod.runner.sequential: one request at a time for a group's rank 0). Each `step()` is one
bounded unit of work, a decode step for the batch and at most one prefill chunk, so between two
steps, even in the middle of a long prompt, the loop picks up new requests, drops cancelled
ones (the client went away: its slot is free before the next step) and, once asked to stop,
lets in-flight work finish until the drain deadline, then ends it with an error event and
returns (the runner exits 0). A stop is therefore answered at rung 1 of the ladder.

The heartbeat (WATCHDOG=1, when the parent asked for one via WATCHDOG_USEC, as systemd does)
keeps going while generating. The engine's figures (batch width, prompt cache) go to the daemon
as a `stats` event whenever the number of running requests changes.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from typing import Any, Protocol

from exod.protocol import Message
from exod.runner.channel import STOP, Channel
from exod.runner.lifecycle import Lifecycle
from exod.runner.log import ERR, log
from exod.runner.notify import Notifier
from exod.sdnotify_wire import watchdog_interval


class Engine(Protocol):
    @property
    def busy(self) -> bool: ...
    @property
    def active(self) -> int: ...
    def admit(self, req: Message) -> None: ...
    def cancel(self, rid: str) -> None: ...
    def step(self) -> list[Message]: ...
    def abort_all(self, code: str, message: str) -> list[Message]: ...
    def stats(self) -> dict[str, Any]: ...


def take(inbox: queue.Queue[Message], block: bool, timeout: float | None) -> list[Message]:
    """Everything waiting in the inbox; when `block`, wait for at least one message first."""
    out: list[Message] = []
    try:
        if block:
            out.append(inbox.get(timeout=timeout))
        while True:
            out.append(inbox.get_nowait())
    except queue.Empty:
        pass
    return out


class Shown:
    """What the daemon last heard of the engine: STATUS= for the rank, and the stats event."""

    def __init__(self, notify: Notifier, channel: Channel, engine: Engine) -> None:
        self.notify, self.channel, self.engine = notify, channel, engine
        self.active = -1

    def update(self) -> None:
        active = self.engine.active
        if active != self.active:
            self.active = active
            self.notify.status(f"serving {active} request(s)" if active else "ready")
            self.channel.send({"ev": "stats", "stats": self.engine.stats()})


def serve(engine: Engine, channel: Channel, life: Lifecycle, notify: Notifier,
          tick: Callable[[], None] | None = None, tick_every: float | None = None) -> None:
    """`tick` runs at least every `tick_every` seconds from this loop (between steps, or when
    idle): rank 0 of a group keeps the group's heartbeat with it."""
    from exod.runner.generate import RequestError  # imports mlx: runner only

    interval = watchdog_interval()
    beat = max(0.05, interval) if interval else None
    next_beat = time.monotonic() + beat if beat else None
    next_tick = time.monotonic() + tick_every if tick and tick_every else None
    wake = min((x for x in (beat, tick_every if tick else None) if x), default=None)
    deadline: float | None = None  # end of the drain, once asked to stop
    shown = Shown(notify, channel, engine)

    def send(events: list[Message]) -> None:
        for ev in events:
            channel.send(ev)

    shown.update()
    while True:
        stopping = life.stop.is_set()
        if stopping and deadline is None:
            deadline = time.monotonic() + (channel.drain or 0.0)
        cancels = channel.cancelled.copy()  # set.copy: atomic against the channel thread
        for msg in take(channel.inbox, block=not engine.busy and not stopping, timeout=wake):
            if msg is STOP or msg.get("op") != "generate":
                continue
            rid = str(msg.get("id"))
            if rid in channel.cancelled:  # the client left while the request was on its way
                channel.cancelled.discard(rid)
                continue
            if life.stop.is_set():
                send([{"id": rid, "ev": "error", "code": "stopping",
                       "message": "the instance is stopping"}])
                continue
            try:
                engine.admit(msg)
            except RequestError as e:
                send([{"id": rid, "ev": "error", "code": "bad_request", "message": str(e)}])
            except Exception as e:  # noqa: BLE001 -- never let one request end the runner
                log(f"request {rid} refused: {type(e).__name__}: {e}", ERR)
                send([{"id": rid, "ev": "error", "code": "internal",
                       "message": f"{type(e).__name__}: {e}"}])

        if deadline is not None and (not engine.busy or time.monotonic() >= deadline):
            send(engine.abort_all("aborted", f"aborted: the instance is stopping "
                                             f"({life.reason}; drain of "
                                             f"{channel.drain or 0:g}s is over)"))
            shown.update()
            return

        # Every request these cancels name was already in the inbox when they were read, so it
        # has been taken above: cancelling now cannot miss one that is still on its way.
        for rid in cancels:
            engine.cancel(rid)
            channel.cancelled.discard(rid)

        shown.update()
        send(engine.step())
        # Again now: the loop may next block for a long time with nothing to do.
        shown.update()

        if next_beat is not None and time.monotonic() >= next_beat:
            notify.watchdog()
            next_beat = time.monotonic() + (beat or 0.0)
        if next_tick is not None and tick is not None and time.monotonic() >= next_tick:
            tick()
            next_tick = time.monotonic() + (tick_every or 0.0)

