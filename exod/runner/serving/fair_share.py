"""Whom the batch engine starts next, and whom it holds back: weighted fair shares of the batch
between keys (docs/design/fair-share.md). Pure: the engine (exod.runner.serving.batch_engine)
tells it what arrives, starts, is served and leaves, and does what it says.

Each key has a virtual time: the tokens served to it (prompt chunks and decoded tokens alike),
each divided by its weight. When a row frees, the waiting request of the key with the least
virtual time starts (its own requests in order of arrival), so keys that all want more are
served tokens in proportion to their weights. A key that had nothing in the engine starts at
the least virtual time of those that have: no credit banked while away, no debt from an hour
alone. `batch` priority only starts while no `interactive` request waits, and is held back
(`preempt`) when one waits for its row. Decisions depend only on what the engine tells, in the
order it tells it, so a group's ranks, replaying the same admissions and steps, decide the same.
`fifo`: first come first served, nobody held back (the engine before; `bench fair` compares).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Literal

Priority = Literal["interactive", "batch"]
Policy = Literal["fair", "fifo"]


@dataclass
class Claim:
    rid: str
    key: str
    weight: float
    priority: Priority
    order: int  # arrival: the order within a key, and FIFO's whole order
    running: bool = False
    started: int = 0  # when it last started (the latest started is held back first)


@dataclass
class FairShare:
    policy: Policy = "fair"
    vtime: dict[str, float] = field(default_factory=dict)  # by key
    entries: dict[str, Claim] = field(default_factory=dict)  # by request, waiting or running
    _arrivals: itertools.count[int] = field(default_factory=itertools.count)
    _starts: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def arrive(self, rid: str, key: str, weight: float = 1.0,
               priority: Priority = "interactive") -> None:
        """A request waits to start."""
        if not any(e.key == key for e in self.entries.values()):
            # Back after a while, or new: at the least virtual time of the keys in the engine.
            active = [self.vtime.get(e.key, 0.0) for e in self.entries.values()]
            if active:
                self.vtime[key] = max(self.vtime.get(key, 0.0), min(active))
            else:
                self.vtime.setdefault(key, 0.0)
        self.entries[rid] = Claim(rid, key, weight, priority, next(self._arrivals))

    def next(self) -> str | None:
        """The waiting request to start next, or None."""
        waiting = [e for e in self.entries.values() if not e.running]
        if not waiting:
            return None
        if self.policy == "fifo":
            return min(waiting, key=lambda e: e.order).rid
        if any(e.priority == "interactive" for e in waiting):
            waiting = [e for e in waiting if e.priority == "interactive"]
        rows = self.rows()
        return min(waiting, key=lambda e: (self.vtime[e.key], rows.get(e.key, 0), e.order)).rid

    def start(self, rid: str) -> None:
        e = self.entries[rid]
        e.running, e.started = True, next(self._starts)

    def hold(self, rid: str) -> None:
        """A running request held back (preempted): it waits again, in its place."""
        self.entries[rid].running = False

    def served(self, rid: str, tokens: int) -> None:
        """`tokens` went through the model for `rid` (a prompt chunk, or decoded)."""
        e = self.entries.get(rid)
        if e is not None and tokens > 0:
            self.vtime[e.key] += tokens / e.weight

    def gone(self, rid: str) -> None:
        """Finished, cancelled or failed."""
        self.entries.pop(rid, None)
        if not self.entries:  # nobody in the engine: start over from 0, the order kept
            low = min(self.vtime.values(), default=0.0)
            self.vtime = {k: v - low for k, v in self.vtime.items()}

    def preempt(self, candidates: list[str]) -> str | None:
        """Which of `candidates` (running requests the engine can hold back) to hold back for
        an interactive request that waits for a row: a `batch` one, of the key most served,
        the latest started first; None when no interactive request waits or none fits."""
        if self.policy == "fifo" or not any(
                not e.running and e.priority == "interactive" for e in self.entries.values()):
            return None
        batch = [self.entries[rid] for rid in candidates
                 if rid in self.entries and self.entries[rid].priority == "batch"]
        if not batch:
            return None
        return max(batch, key=lambda e: (self.vtime[e.key], e.started)).rid

    def waiting(self) -> int:
        return sum(not e.running for e in self.entries.values())

    def rows(self) -> dict[str, int]:
        """Running requests by key."""
        out: dict[str, int] = {}
        for e in self.entries.values():
            if e.running:
                out[e.key] = out.get(e.key, 0) + 1
        return out
