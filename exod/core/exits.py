"""How processes end, and the exit-code protocol between runner, daemon and exoctl."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

# Runner → daemon. sysexits.h numbers, so they also read well under plain systemd.
EXIT_OK = 0
EXIT_USAGE = 64  # EX_USAGE: bad runner arguments (a bug in exod, not the operator's fault)
EXIT_MODEL = 65  # EX_DATAERR: this model cannot be loaded; retrying will not help
EXIT_UNAVAILABLE = 69  # EX_UNAVAILABLE: a needed resource is missing (e.g. mlx not installed)
EXIT_TEMPFAIL = 75  # EX_TEMPFAIL: try again later (e.g. an address in use)
EXIT_PEER_LOST = 76  # EX_PROTOCOL: another rank of the group is gone; restart and regroup
# The daemon's verdict on a runner that broke its channel's protocol (then ended by the ladder).
EXIT_PROTOCOL = EXIT_PEER_LOST
EXIT_CONFIG = 78  # EX_CONFIG: `exod check`/`exod run` with an invalid config

# exoctl → shell, as systemctl does: 3 means "not running".
EXIT_NOT_RUNNING = 3

# Exits after which a restart is pointless: straight to `failed`.
PERMANENT_EXIT_CODES = frozenset({EXIT_USAGE, EXIT_MODEL, EXIT_UNAVAILABLE, EXIT_CONFIG})


@dataclass(frozen=True)
class ExitInfo:
    """A decoded wait status: exactly one of `code` and `signal` is set."""

    code: int | None = None
    signal: int | None = None

    @classmethod
    def from_wait_status(cls, status: int) -> ExitInfo:
        if os.WIFSIGNALED(status):
            return cls(signal=os.WTERMSIG(status))
        return cls(code=os.WEXITSTATUS(status))

    @property
    def clean(self) -> bool:
        return self.code == 0

    @property
    def permanent(self) -> bool:
        return self.code in PERMANENT_EXIT_CODES

    def __str__(self) -> str:
        if self.signal is not None:
            return f"signal {self.signal} ({signal_name(self.signal)})"
        return f"exit code {self.code}"

    def to_json(self) -> dict[str, object]:
        return {"code": self.code, "signal": self.signal, "text": str(self)}


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"SIG{signum}"


@dataclass(frozen=True)
class Hung(ExitInfo):
    """Not an exit: the daemon gave up on a runner that stopped making progress while serving.
    Counted as a failure (restart policy, start limit), and retrying may help."""

    code: int | None = EXIT_TEMPFAIL

    def __str__(self) -> str:
        return "hung"
