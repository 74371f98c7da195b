"""The one state machine of exod, used for every rank and every instance.

`stopped → starting → loading → ready → stopping → stopped`, plus `backoff` (waiting to restart)
and `failed` (stays put until an operator says `exoctl start`). An instance whose model is named
by hub repository and not yet in the cache goes through `downloading` before `starting`. All
legal moves are in TRANSITIONS; `Machine.move` is the only way to change a state. Pure: no I/O,
time is passed in. A download has states of its own (exod.daemon.downloads), moved by the same
`Tracked.move` against its own table.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar


class State(str, enum.Enum):
    STOPPED = "stopped"
    DOWNLOADING = "downloading"  # fetching the model's files; no runner exists yet
    STARTING = "starting"  # process spawned, not yet reporting progress
    LOADING = "loading"  # reporting layers n/N
    READY = "ready"  # READY=1 received (for an instance: from every rank)
    STOPPING = "stopping"  # the termination ladder is running
    BACKOFF = "backoff"  # exited unexpectedly; a restart is scheduled
    FAILED = "failed"  # will not restart by itself

    def __str__(self) -> str:
        return self.value

    @property
    def active(self) -> bool:
        """Processes may be alive in this state."""
        return self in _ACTIVE


_ACTIVE = frozenset({State.DOWNLOADING, State.STARTING, State.LOADING, State.READY, State.STOPPING})

S = State
TRANSITIONS: dict[State, frozenset[State]] = {
    S.STOPPED: frozenset({S.STARTING, S.DOWNLOADING}),
    # A download is never timed out; it ends fetched (→ starting), refused (→ failed: not
    # found, no access, disk too small), or stopped (through its own ladder, or at once when
    # another instance still waits for the same download).
    S.DOWNLOADING: frozenset({S.STARTING, S.STOPPING, S.STOPPED, S.FAILED}),
    # A runner may send READY=1 without any progress (a model with nothing to load).
    S.STARTING: frozenset({S.LOADING, S.READY, S.STOPPING, S.BACKOFF, S.FAILED, S.STOPPED}),
    S.LOADING: frozenset({S.READY, S.STOPPING, S.BACKOFF, S.FAILED, S.STOPPED}),
    S.READY: frozenset({S.STOPPING, S.BACKOFF, S.FAILED, S.STOPPED}),
    # A stop ends in stopped. When one rank of a group died, the siblings are stopped first and
    # the group then goes to backoff (restart) or failed (given up).
    S.STOPPING: frozenset({S.STOPPED, S.BACKOFF, S.FAILED}),
    # A stop during backoff cancels the restart; the start limit can fail it.
    S.BACKOFF: frozenset({S.STARTING, S.DOWNLOADING, S.STOPPED, S.FAILED}),
    S.FAILED: frozenset({S.STARTING, S.DOWNLOADING, S.STOPPED}),
}


class IllegalTransition(RuntimeError):
    pass


E = TypeVar("E", bound=enum.Enum)


@dataclass(frozen=True)
class Transition(Generic[E]):
    old: E
    new: E
    at: float
    reason: str


@dataclass
class Tracked(Generic[E]):
    """A state plus when it was entered and why; `move` validates against `table`."""

    state: E
    table: Mapping[E, frozenset[E]] = field(repr=False)
    since: float = 0.0
    reason: str = ""
    history: list[Transition[E]] = field(default_factory=list)
    history_limit: int = 32

    def can(self, new: E) -> bool:
        return new in self.table[self.state]

    def move(self, new: E, now: float, reason: str = "") -> Transition[E]:
        if new not in self.table[self.state]:
            raise IllegalTransition(f"{self.state} → {new} is not allowed ({reason})")
        t = Transition(self.state, new, now, reason)
        self.state, self.since, self.reason = new, now, reason
        self.history.append(t)
        del self.history[: max(0, len(self.history) - self.history_limit)]
        return t


@dataclass
class Machine(Tracked[State]):
    """An instance's or a rank's state, moved by TRANSITIONS."""

    state: State = State.STOPPED
    table: Mapping[State, frozenset[State]] = field(default_factory=lambda: TRANSITIONS,
                                                    repr=False)
