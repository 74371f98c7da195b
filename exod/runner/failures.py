"""What ends a runner before it is asked to stop, and the exit code each gives the daemon: one
table for every kind of runner (text, vision, embed). The codes are a protocol
(exod.core.exits): the daemon marks the instance failed after a permanent one (a model that
cannot load, a missing library) instead of restarting it forever, and retries the others with
backoff. Imports no mlx: the table must hold even where mlx cannot be imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from exod.core.exits import EXIT_MODEL, EXIT_PEER_LOST, EXIT_TEMPFAIL, EXIT_UNAVAILABLE


class LoadAborted(Exception):
    """The runner was asked to stop while loading: a requested stop, no failure."""


class ModelError(Exception):
    """This model cannot be loaded by this runner (retrying will not help)."""


class CannotServe(Exception):
    """The spec asks what this kind of runner does not do with this model (an option it
    refuses, a model that no longer is what the daemon saw): retrying will not help."""


class Unavailable(Exception):
    """A library this runner needs cannot be imported; the message says which, and how to get
    it."""


class AddressInUse(Exception):
    """A rank's address is taken (another instance or program on its port): retried."""


class PeerLost(BaseException):
    """The group is broken. A BaseException so that no `except Exception` meant for one
    request swallows it: the whole runner must exit and be restarted."""


@dataclass(frozen=True)
class Exit:
    """An exception, the exit code it ends the runner with, and the reason the daemon is told
    (`{model}`: the model's folder, `{error}`: the exception)."""

    error: type[BaseException]
    code: int
    reason: str


EXITS: tuple[Exit, ...] = (
    Exit(Unavailable, EXIT_UNAVAILABLE, "{error}"),
    Exit(CannotServe, EXIT_MODEL, "cannot serve {model}: {error}"),
    Exit(ModelError, EXIT_MODEL, "cannot load {model}: {error}"),
    Exit(AddressInUse, EXIT_TEMPFAIL,
         "address {error} is in use (another instance or program on its port?)"),
    Exit(PeerLost, EXIT_PEER_LOST, "peer lost: {error}; exiting so the group can form again"),
)
# What `except` catches to look the exception up in EXITS.
FAILURES: tuple[type[BaseException], ...] = tuple(e.error for e in EXITS)


def exit_for(error: BaseException, model: Path) -> tuple[int, str]:
    """The exit code and the reason of one of FAILURES."""
    row = next(e for e in EXITS if isinstance(error, e.error))
    return row.code, row.reason.format(model=model, error=error)
