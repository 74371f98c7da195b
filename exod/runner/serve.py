"""The runner's serve loop: wait for work on the channel until asked to stop.

Generation requests arrive here once the HTTP API exists; until then the loop only keeps the
heartbeat going (WATCHDOG=1 when the parent asked for one via WATCHDOG_USEC, as systemd does).
"""

from __future__ import annotations

import os
import queue

from exod.runner.channel import STOP, Channel
from exod.runner.lifecycle import Lifecycle
from exod.runner.load import Loaded
from exod.runner.notify import Notifier


def heartbeat_interval() -> float | None:
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return max(0.05, int(usec) / 2e6)
    except ValueError:
        return None


def serve(loaded: Loaded, channel: Channel, life: Lifecycle, notify: Notifier) -> None:
    beat = heartbeat_interval()
    while not life.stop.is_set():
        try:
            msg = channel.inbox.get(timeout=beat)
        except queue.Empty:
            notify.watchdog()
            continue
        if msg is STOP:
            break
