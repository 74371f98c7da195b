"""Whom the batch engine starts next, and whom it holds back: weighted fair shares of the batch
between keys (docs/design/fair-share.md). Pure: the engine (exod.runner.serving.batch_engine)
says what arrives, starts, is served and leaves, and does what this says.

Each key has a virtual time: the tokens served to it (prompt chunks and decoded tokens), each
divided by its weight. When a row frees, the key least served starts its oldest waiting request,
so keys that all want more get tokens in proportion to their weights. A key that had nothing in
the engine comes in at the least virtual time of those that have: no credit banked while away.
`batch` work starts only while no interactive request waits or is in its prompt, and is held
back (`preempt`) while one is: it yields the batch to a person's first token, then fills the
rows left. Decisions depend only on what the engine says, in its order, so a group's ranks,
replaying the same admissions and steps, decide the same. `fifo`: first come first served.
"""

from __future__ import annotations

import itertools
from collections.abc import Set as AbstractSet
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

    def urgent(self, prompts: AbstractSet[str]) -> bool:
        """An interactive request waits, or is among `prompts` (running, no token yet): `batch`
        work yields to it."""
        return self.policy == "fair" and any(
            e.priority == "interactive" and (not e.running or e.rid in prompts)
            for e in self.entries.values())

    def next(self, batch: bool = True) -> str | None:
        """The waiting request to start next, or None. `batch`: False while `urgent`."""
        waiting = [e for e in self.entries.values() if not e.running]
        if self.policy == "fifo":
            return min(waiting, key=lambda e: e.order).rid if waiting else None
        if not batch or any(e.priority == "interactive" for e in waiting):
            waiting = [e for e in waiting if e.priority == "interactive"]
        if not waiting:
            return None
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

    def preempt(self, candidates: list[str], prompts: AbstractSet[str] = frozenset()
                ) -> str | None:
        """Which of `candidates` (running requests the engine can hold back) to hold back for
        interactive work (`urgent`: `prompts` are those running without a token yet): a `batch`
        one, of the key most served, the latest started first; None when none fits."""
        if not self.urgent(prompts):
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
