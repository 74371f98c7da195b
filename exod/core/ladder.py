"""The termination ladder, as data, and a pure evaluator driven by deadlines.

Rung 1 asks the runner to shut down over its channel and waits `grace`; rung 2 sends SIGTERM
`attempts` times, `interval` apart; rung 3 sends SIGKILL, repeated every `kill_interval` until the
process is reaped. The caller performs the actions and calls `due(now)` at `deadline`; nothing
here sleeps or touches a process.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol


# The same name as exod.config.schema.StopPolicy, which it describes: core imports no config.
class StopPolicy(Protocol):
    """What the ladder reads of a stop policy (the config's `stop`), in seconds."""

    @property
    def grace(self) -> float: ...

    @property
    def attempts(self) -> int: ...

    @property
    def interval(self) -> float: ...

    @property
    def kill_interval(self) -> float: ...


class Step(str, enum.Enum):
    ASK = "ask"  # shutdown request over the runner's channel
    TERM = "SIGTERM"
    KILL = "SIGKILL"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Rung:
    step: Step
    wait: float  # seconds until the next rung


def rungs(policy: StopPolicy) -> tuple[Rung, ...]:
    """The ladder for a policy. The last rung (SIGKILL) repeats until the process is gone."""
    return (
        (Rung(Step.ASK, policy.grace),)
        + tuple(Rung(Step.TERM, policy.interval) for _ in range(policy.attempts))
        + (Rung(Step.KILL, policy.kill_interval),)
    )


def worst_case(policy: StopPolicy) -> float:
    """Seconds from the start of a stop until SIGKILL would be sent: the ladder's worst case."""
    return policy.grace + policy.attempts * policy.interval


# Room after the ladder's last SIGTERM for the SIGKILL rung, the reaping and exod's own exit:
# what exod asks of the service manager's stop timeout beyond the worst case.
STOP_MARGIN = 5.0


def longest(policies: Iterable[StopPolicy]) -> float:
    """The worst case of the longest of these ladders (a config's: its defaults' included)."""
    return max(worst_case(p) for p in policies)


def describe(policy: StopPolicy) -> str:
    """e.g. 'ask, wait 10s → SIGTERM ×3 every 5s → SIGKILL (worst case 25s)'."""
    return (
        f"ask, wait {policy.grace:g}s → SIGTERM ×{policy.attempts} every {policy.interval:g}s"
        f" → SIGKILL (worst case {worst_case(policy):g}s)"
    )


class LadderRun:
    """One walk down the ladder for one process."""

    def __init__(self, policy: StopPolicy, now: float) -> None:
        self._rungs = rungs(policy)
        self._index = 0
        self.started = now
        self.deadline = now + self._rungs[0].wait
        self.sent: list[tuple[float, Step]] = [(now, Step.ASK)]

    @property
    def first(self) -> Step:
        """The action to perform right away when the run starts."""
        return self._rungs[0].step

    @property
    def current(self) -> Step:
        return self._rungs[self._index].step

    def due(self, now: float) -> Step | None:
        """The next action if its time has come (then the deadline moves on), else None.

        One step per call: the caller reschedules at `deadline`. Deadlines chain from the previous
        deadline, so a late tick compresses the rest of the ladder instead of stretching it; the
        worst case before SIGKILL therefore holds even when the event loop was slow. Only the
        repeated SIGKILL restarts its period from `now`, so a late loop sends one, not a burst.
        """
        if now < self.deadline:
            return None
        if self._index < len(self._rungs) - 1:
            self._index += 1
        rung = self._rungs[self._index]
        self.sent.append((now, rung.step))
        if rung.step is Step.KILL:
            self.deadline = max(self.deadline + rung.wait, now + rung.wait)
        else:
            self.deadline += rung.wait
        return rung.step

    def skip_grace(self, now: float) -> None:
        """A second stop request: go straight to SIGTERM (still never skips to SIGKILL)."""
        if self._index == 0:
            self.deadline = min(self.deadline, now)

    def time_to_kill(self, now: float) -> float:
        """Seconds until SIGKILL would be sent from here (0 once it has been)."""
        if self.current is Step.KILL:
            return 0.0
        remaining = self.deadline - now
        for rung in self._rungs[self._index + 1 : -1]:
            remaining += rung.wait
        return max(0.0, remaining)
