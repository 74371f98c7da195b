"""The recent output of every runner, kept in memory: a bounded ring of lines per rank.

`exoctl logs` and the status page read it; it works wherever exod runs (no journald needed).
A ring outlives its runner's restarts, so the last words of a crashed runner stay readable.
Followers get each new line as it is added; a follower that cannot keep up loses lines rather
than growing the daemon's memory.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from exod.wire.control import LineEvent

LINES_PER_RANK = 1000
MAX_TEXT = 4096  # longer lines are cut in the ring (the log itself keeps them whole)


@dataclass(frozen=True)
class Line:
    time: float  # wall clock, for people
    instance: str
    rank: int
    pid: int
    level: str
    text: str

    def event(self) -> LineEvent:
        return LineEvent(time=round(self.time, 3), instance=self.instance, rank=self.rank,
                         pid=self.pid, level=self.level, text=self.text)

    def to_json(self) -> dict[str, object]:
        """For the status page."""
        return {"time": round(self.time, 3), "instance": self.instance, "rank": self.rank,
                "pid": self.pid, "level": self.level, "text": self.text}


Follower = Callable[[Line], None]


class LogRings:
    def __init__(self, per_rank: int = LINES_PER_RANK,
                 clock: Callable[[], float] = time.time) -> None:
        self.per_rank = per_rank
        self.clock = clock
        self._rings: dict[tuple[str, int], collections.deque[Line]] = {}
        self._followers: set[Follower] = set()

    def add(self, context: dict[str, object], level: str, text: str) -> None:
        """One line a runner printed; `context` names its instance, rank and pid."""
        instance, rank = str(context.get("instance", "")), _int(context.get("rank"))
        key = (instance, rank)
        ring = self._rings.get(key)
        if ring is None:
            ring = self._rings[key] = collections.deque(maxlen=self.per_rank)
        line = Line(self.clock(), instance, rank, _int(context.get("pid")), level,
                    text[:MAX_TEXT])
        ring.append(line)
        for fn in list(self._followers):
            fn(line)

    def tail(self, instance: str, n: int, rank: int | None = None) -> list[Line]:
        """The last `n` lines of the instance (of one rank, or of all merged by time)."""
        if n <= 0:
            return []
        rings = [r for (name, k), r in self._rings.items()
                 if name == instance and (rank is None or k == rank)]
        lines: Iterable[Line]
        if len(rings) == 1:
            lines = rings[0]
        else:
            lines = sorted((line for r in rings for line in r), key=lambda ln: ln.time)
        return list(lines)[-n:]

    def follow(self, fn: Follower) -> Callable[[], None]:
        """Call `fn` with every new line; returns the function that stops it."""
        self._followers.add(fn)
        return lambda: self._followers.discard(fn)

    def forget(self, instance: str) -> None:
        """The instance is gone from the config: its lines go too."""
        for key in [k for k in self._rings if k[0] == instance]:
            del self._rings[key]


def _int(value: object) -> int:
    return value if isinstance(value, int) else -1
