"""What follows a stop: the intent an instance's STOPPING state carries, as systemd's job on a
unit does, instead of flags beside the state.

A stop ends when every process of the instance is gone; then its intent decides: stay stopped
(`StayStopped`), stay stopped across reloads until an operator starts it (`Hold`), start again
(`Again`), follow the restart policy after a failure (`Recover`), or make way for what a reload
put in its place (`Retire`). A second request during the stop merges into the intent it finds
(`on_stop`, `on_start`, `on_retire`). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

from exod.core.restarts import Decision

Settings = TypeVar("Settings")  # what replaces a retired instance: its new config (the daemon's)


@dataclass(frozen=True)
class StayStopped:
    """Stay stopped: exod is stopping, the instance is idle or evicted, a plain stop."""


@dataclass(frozen=True)
class Hold:
    """An operator stopped it: it stays stopped, across a reload too, until an operator
    starts it."""


@dataclass(frozen=True)
class Again:
    """Start again once every process is gone (a restart; a start asked during a stop)."""

    operator: bool


@dataclass(frozen=True)
class Recover:
    """A failure (a rank died, hung or broke its protocol): the restart policy's decision,
    taken when it happened, applies once the rest of the group is gone."""

    decision: Decision


@dataclass(frozen=True)
class Retire(Generic[Settings]):
    """A reload removed it (`replacement` None) or changed it: this runtime never starts
    again, and the replacement takes its place once it is stopped. `restart`: it was running,
    so the replacement starts; `hold`: an operator's stop holds the replacement too."""

    replacement: Settings | None
    hold: bool
    restart: bool


Intent = StayStopped | Hold | Again | Recover | Retire[Any]


@dataclass
class StopJob:
    """A stop asked of an instance: what follows it and who waits for it. It lives while the
    instance is stopping and, once stopped, until the next start: a `Hold` or `Retire`
    outlasts the stop itself."""

    then: Intent
    waiters: list[Callable[[], None]] = field(default_factory=list)


def holds(intent: Intent | None) -> bool:
    return isinstance(intent, Hold) or (isinstance(intent, Retire) and intent.hold)


def on_stop(current: Intent | None, operator: bool) -> Intent:
    """A stop cancels the start or the recovery that was to follow; an operator's stop holds.
    A retirement stays one: the reload that asked for it decides what follows."""
    if isinstance(current, Retire):
        return replace(current, hold=current.hold or operator)
    return Hold() if operator or isinstance(current, Hold) else StayStopped()


def on_start(current: Intent, operator: bool) -> Intent:
    """A start asked during a stop runs once the stop completes (an operator's releases a hold);
    one asked of a runtime being retired is the replacement's to honour."""
    if isinstance(current, Retire):
        return replace(current, hold=current.hold and not operator)
    return Again(operator or (isinstance(current, Again) and current.operator))


def on_retire(current: Intent | None, replacement: Settings | None,
              running: bool) -> Retire[Settings]:
    """A reload during a retirement only changes what replaces it: the latest config wins."""
    if isinstance(current, Retire):
        return replace(current, replacement=replacement)
    return Retire(replacement, hold=holds(current), restart=running)
