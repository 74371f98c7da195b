"""Prompts in flight that share a prefix: it goes through the model once.

A burst of agents starts with the same system prompt and tools. The prompt cache serves a
prefix only once a request that had it is done, so without this each of them would prefill it.
Here a request whose prompt starts like one already in the batch (a *leader*, prefilling or
past its prompt) by at least `min_shared` tokens more than its own cache covers *follows* it:
it waits outside the batch until the leader's cache holds the shared part, then starts from a
copy of it. Copies, not one row held in common: mlx-lm's batch caches are one array per layer
with a row per request, so a row must own its prefix anyway; a copy costs memory bandwidth
once, where prefilling costs the model's whole forward pass again.

When the leader's caches can be rewound (every layer a plain KV cache), a follower waits until
the leader's cache holds its whole shared part and takes a copy rewound to it, whatever the
leader did after. Otherwise (a recurrent state, a sliding window) it takes the leader's cache
at the last chunk boundary before its shared part ends, and prefills the rest itself.

This module decides; the engine (exod.runner.serving.batch_engine) extracts and inserts. The
decisions depend only on the prompts, the order of admission and the batch's progress, so a
group's ranks, replaying the same admissions and steps, decide the same.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol


class InFlight(Protocol):
    rid: str
    prompt: list[int]
    in_cache: int  # tokens of its own sequence its cache holds now


@dataclass
class Follower:
    rid: str
    upto: int  # prompt tokens the leader's cache can give it


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    # In blocks first: prompts of many thousand tokens, compared on every admission.
    block = 256
    while i + block <= n and a[i:i + block] == b[i:i + block]:
        i += block
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Sharing:
    """Who follows whom. `exact`: the leader's cache can be rewound to any length."""

    def __init__(self, min_shared: int, exact: bool) -> None:
        self.min_shared = max(1, min_shared)
        self.exact = exact
        self.followers: dict[str, list[Follower]] = {}  # by leader
        self.leader_of: dict[str, str] = {}  # by follower
        self.loading: dict[tuple[str, int], str] = {}  # (disk entry, tokens it covers): by whom

    def choose(self, prompt: list[int], covered: int, leaders: Iterable[InFlight]
               ) -> tuple[str, int] | None:
        """The leader a new prompt should follow and how far, or None (prefill it alone).
        `covered`: what its own prompt cache lookup gave it. The last prompt token always goes
        through the model (its logits are the first answer token's)."""
        best: tuple[str, int] | None = None
        for lead in leaders:
            upto = min(common_prefix(prompt, lead.prompt), len(prompt) - 1)
            if upto - covered < self.min_shared:
                continue
            if not self.exact and lead.in_cache >= upto:
                continue  # past the point, and its cache cannot be rewound to it
            if best is None or upto > best[1]:
                best = (lead.rid, upto)
        return best

    def loads(self, rid: str, key: str, usable: int) -> None:
        """`rid` loads disk entry `key` to cover `usable` tokens."""
        self.loading[(key, usable)] = rid

    def loaded(self, rid: str) -> None:
        """`rid`'s load is over (or it is gone)."""
        for k in [k for k, who in self.loading.items() if who == rid]:
            del self.loading[k]

    def join_load(self, rid: str, key: str, usable: int) -> bool:
        """Whether `rid`, which would load `key` to cover `usable` tokens, follows the request
        loading it already (to cover as many, or more where a copy can be rewound)."""
        lead = next((who for (k, n), who in self.loading.items() if k == key and (
            n == usable or (n > usable and self.exact))), None)
        if lead is not None:
            self.follow(rid, lead, usable)
        return lead is not None

    def follow(self, rid: str, leader: str, upto: int) -> None:
        self.followers.setdefault(leader, []).append(Follower(rid, upto))
        self.leader_of[rid] = leader

    def due(self, leader: str, in_cache: int, chunk: int) -> list[Follower]:
        """The followers of `leader` to start now: its cache holds `in_cache` tokens, and its
        next step may add `chunk` more. Exact: those whose shared part it holds whole. Else:
        those whose shared part the next chunk would run past (this is the last boundary)."""
        waiting = self.followers.get(leader)
        if not waiting:
            return []
        ready = [f for f in waiting
                 if (in_cache >= f.upto if self.exact else in_cache + chunk > f.upto)]
        if ready:
            self._forget(leader, ready)
        return ready

    def release(self, leader: str) -> list[Follower]:
        """The leader is gone (cancelled, failed, done): its followers start on their own."""
        gone = self.followers.pop(leader, [])
        for f in gone:
            self.leader_of.pop(f.rid, None)
        return gone

    def drop(self, rid: str) -> None:
        """A follower is gone (cancelled)."""
        leader = self.leader_of.get(rid)
        if leader is not None:
            self._forget(leader, [f for f in self.followers.get(leader, []) if f.rid == rid])

    def waiting(self, rid: str) -> bool:
        return rid in self.leader_of

    @property
    def leaders(self) -> list[str]:
        return list(self.followers)

    def _forget(self, leader: str, gone: list[Follower]) -> None:
        rest = [f for f in self.followers.get(leader, []) if f not in gone]
        for f in gone:
            self.leader_of.pop(f.rid, None)
        if rest:
            self.followers[leader] = rest
        else:
            self.followers.pop(leader, None)
