"""What exod's two sd_notify senders share (the daemon telling its service manager, a runner
telling the daemon): the text put on the wire, and the watchdog interval the environment asks
for. Imports nothing heavy: the runner and the daemon both use it."""

from __future__ import annotations

import os
from collections.abc import Iterable


def wire(lines: Iterable[str]) -> str:
    """The datagram's text for the sdnotify package. It encodes latin-1, which raises on
    anything else: handed the UTF-8 bytes spelled as latin-1 code points, it puts exactly
    those UTF-8 bytes on the wire."""
    return "\n".join(lines).encode("utf-8").decode("latin-1")


def one_line(text: str) -> str:
    """A value fit for a KEY=VALUE line (STATUS=, X_EXOD_ERROR=): whitespace runs to a space."""
    return " ".join(text.split())


def watchdog_interval() -> float | None:
    """Half of WATCHDOG_USEC, if the watchdog is meant for this process (WATCHDOG_PID)."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 2e6 if value > 0 else None
