"""A group whose ranks all run on this host must form in time.

Once every rank is joining (connecting to its peers), the group forms within seconds, or
something holds its ports: a rank's MLX listener sharing its port with another program's waits
in accept() forever. So the watch bounds that one wait, on the seam's clock. Across hosts,
waiting is right: a peer host may be down for hours, and no bound applies.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from exod.wire import messages as m
from exod.core.durations import format_duration
from exod.daemon.clock import Clock, Timer
from exod.daemon.rank import RankRuntime

# The least time a group on this host alone may take to form once every rank is joining it:
# MLX's ring waits up to 8 s between its own connection attempts.
FORM_WITHIN_AT_LEAST = 30.0


def all_joining(ranks: Sequence[RankRuntime]) -> bool:
    """A group of several ranks, all on this host, all running and connecting to the others."""
    return len(ranks) > 1 and all(
        r.local and r.pid is not None and r.phase is m.Phase.CONNECTING for r in ranks)


def not_formed(within: float) -> str:
    return (f"the group did not form within {format_duration(within)} although all its "
            "ranks run on this host (ports held by another program?)")


class FormingWatch:
    """The bound, armed when every rank is joining (one at a time), cancelled by a start."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._timer: Timer | None = None

    def arm(self, peer_timeout: float, due: Callable[[float], None]) -> None:
        """Call `due(within)` once `within` has passed, unless armed already this run."""
        if self._timer is not None:
            return
        within = max(peer_timeout, FORM_WITHIN_AT_LEAST)

        def fire() -> None:
            self._timer = None
            due(within)

        self._timer = self.clock.call_at(self.clock.now() + within, fire)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
