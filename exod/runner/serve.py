"""The runner's serve loop: generation requests from the daemon, one token at a time.

mlx computes on one device, so the loop advances one token of one generation at a time. The
daemon decides how many requests reach the runner at once (`max_concurrency`, default 1);
when it lets several through, they take turns token by token, so every stream keeps moving.
Between two tokens the loop picks up new requests, drops cancelled ones (the client went
away: cancelled within one token) and, once asked to stop, lets in-flight work finish until
the drain deadline, then ends it with an error event and returns (the runner exits 0).

The heartbeat (WATCHDOG=1, when the parent asked for one via WATCHDOG_USEC, as systemd does)
keeps going while generating.
"""

from __future__ import annotations

import collections
import queue
import time
from collections.abc import Callable

from exod.protocol import Message
from exod.runner.channel import STOP, Channel
from exod.runner.lifecycle import Lifecycle
from exod.runner.load import Loaded
from exod.runner.log import ERR, log
from exod.runner.notify import Notifier
from exod.sdnotify_wire import watchdog_interval


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


def show(notify: Notifier, active: int, shown: int) -> int:
    """STATUS= for the rank when the number of generations changed; returns what is shown."""
    if active != shown:
        notify.status(f"serving {active} request(s)" if active else "ready")
    return active


def serve(loaded: Loaded, channel: Channel, life: Lifecycle, notify: Notifier,
          tick: Callable[[], None] | None = None, tick_every: float | None = None) -> None:
    """`tick` runs at least every `tick_every` seconds from this loop (between tokens, or when
    idle): rank 0 of a group keeps the group's heartbeat with it."""
    from exod.runner.generate import Generation, RequestError  # imports mlx_lm: runner only

    interval = watchdog_interval()
    beat = max(0.05, interval) if interval else None
    next_beat = time.monotonic() + beat if beat else None
    next_tick = time.monotonic() + tick_every if tick and tick_every else None
    wake = min((x for x in (beat, tick_every if tick else None) if x), default=None)
    active: dict[str, Generation] = {}
    recent: collections.deque[str] = collections.deque(maxlen=256)  # finished request ids
    deadline: float | None = None  # end of the drain, once asked to stop
    shown = 0  # generations in STATUS= (what `exoctl status` shows for the rank)

    def finish(rid: str, msg: Message) -> None:
        channel.send(msg)
        active.pop(rid, None)
        recent.append(rid)
        channel.cancelled.discard(rid)

    while True:
        stopping = life.stop.is_set()
        if stopping and deadline is None:
            deadline = time.monotonic() + (channel.drain or 0.0)
        for msg in take(channel.inbox, block=not active and not stopping, timeout=wake):
            if msg is STOP or msg.get("op") != "generate":
                continue
            rid = str(msg.get("id"))
            if rid in channel.cancelled:  # the client left while the request was on its way
                channel.cancelled.discard(rid)
                continue
            if life.stop.is_set():
                finish(rid, {"id": rid, "ev": "error", "code": "stopping",
                             "message": "the instance is stopping"})
                continue
            try:
                active[rid] = Generation(loaded, msg)
            except RequestError as e:
                finish(rid, {"id": rid, "ev": "error", "code": "bad_request", "message": str(e)})
            except Exception as e:  # noqa: BLE001 -- e.g. a chat template that rejects the roles
                finish(rid, {"id": rid, "ev": "error", "code": "bad_request",
                             "message": f"{type(e).__name__}: {e}"})

        now = time.monotonic()
        if deadline is not None and (not active or now >= deadline):
            for rid, gen in list(active.items()):
                gen.close()
                finish(rid, {"id": rid, "ev": "error", "code": "aborted",
                             "message": f"aborted: the instance is stopping ({life.reason}; "
                                        f"drain of {channel.drain or 0:g}s is over)"})
            return

        for rid in channel.cancelled & active.keys():
            active.pop(rid).close()
            channel.cancelled.discard(rid)
        for rid in channel.cancelled.intersection(recent):  # cancels that crossed a `done`
            channel.cancelled.discard(rid)

        shown = show(notify, len(active), shown)
        for rid, gen in list(active.items()):
            try:
                text, reason = gen.step()
            except Exception as e:  # noqa: BLE001 -- mlx raises many types: fail this one, go on
                log(f"generation {rid} failed: {type(e).__name__}: {e}", ERR)
                gen.close()
                code = "bad_request" if isinstance(e, RequestError) else "internal"
                finish(rid, {"id": rid, "ev": "error", "code": code,
                             "message": f"{type(e).__name__}: {e}"})
                continue
            if text:
                channel.send({"id": rid, "ev": "text", "text": text})
            if reason is not None:
                finish(rid, gen.done(reason))
        # Again now: the loop may next block for a long time with nothing to do.
        shown = show(notify, len(active), shown)

        if next_beat is not None and time.monotonic() >= next_beat:
            notify.watchdog()
            next_beat = time.monotonic() + (beat or 0.0)
        if next_tick is not None and tick is not None and time.monotonic() >= next_tick:
            tick()
            next_tick = time.monotonic() + (tick_every or 0.0)
