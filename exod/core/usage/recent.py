"""A key's tokens over the last minutes, for the status page: counts in slots of SLOT seconds,
the oldest dropped as time moves on."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

SLOT = 10.0
SPAN = 300.0  # the status page's "last minutes"


@dataclass
class Recent:
    slots: collections.deque[tuple[int, int]] = field(default_factory=collections.deque)

    def add(self, tokens: int, now: float) -> None:
        slot = int(now // SLOT)
        self._drop(slot)
        if self.slots and self.slots[-1][0] == slot:
            self.slots[-1] = (slot, self.slots[-1][1] + tokens)
        else:
            self.slots.append((slot, tokens))

    def total(self, now: float) -> int:
        self._drop(int(now // SLOT))
        return sum(n for _, n in self.slots)

    def _drop(self, slot: int) -> None:
        oldest = slot - int(SPAN // SLOT) + 1
        while self.slots and self.slots[0][0] < oldest:
            self.slots.popleft()
