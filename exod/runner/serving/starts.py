"""Where a request of the batch engine starts from (exod.runner.serving.batch_engine): what the
prompt cache's tiers hold of its prompt (RAM, or a disk entry to load, the one another request
is loading already included), or a prompt in flight that it follows (exod.runner.serving.
shared_prefix). On a group's other ranks, rank 0's choice of disk entry."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from exod.runner.prompt_cache.tiers import FromDisk, PromptCache
from exod.runner.serving.batch_request import BatchRequest
from exod.runner.serving.shared_prefix import Sharing

# Rank 0's choice for a prompt, which a group's other ranks follow: the disk entry (its key)
# and the prompt tokens it covers; None: RAM or nothing.
DiskChoice = tuple[str, int]
OWN: Any = object()  # look the prompt up in this rank's own tiers

# Into the batch, from a cache covering that many prompt tokens.
Insert = Callable[[BatchRequest, "list[Any] | None", int], None]


class Starts:
    """`requests`: the engine's, by id; `rows`: those in the generator, by uid."""

    def __init__(self, cache: PromptCache, sharing: Sharing, requests: dict[str, BatchRequest],
                 rows: dict[int, BatchRequest], insert: Insert) -> None:
        self.cache, self.sharing, self.requests, self.rows = cache, sharing, requests, rows
        self.insert = insert

    def start(self, r: BatchRequest, disk: DiskChoice | None, counted: bool = True
              ) -> DiskChoice | None:
        """Start `r` from what a tier holds of its prompt (`disk`: OWN to look it up here, else
        rank 0's choice), or following a prompt in flight; the disk entry chosen, if any."""
        self.requests[r.rid] = r
        joined = self._joins_load(r, disk)
        if joined is not None:
            self.cache.counts.lookups += counted
            return joined
        cache, covered, load = None, 0, None
        if disk is OWN:
            cache, covered, load = self.cache.lookup(r.prompt)
        elif disk is None:
            self.cache.counts.lookups += counted
            cache, covered = self.cache.ram_only(r.prompt, counted)
        else:
            self.cache.counts.lookups += 1
            load = self.cache.disk_by_key(*disk)
            if load is None:  # this rank lacks it: the vote makes it a miss on every rank
                load = FromDisk.missing()
        if load is None:
            lead = self.sharing.choose(r.prompt, covered, self.rows.values())
            if lead is None:
                self.insert(r, cache, covered)
            else:  # its shared part is on its way through the model: it waits for it
                if counted and covered:  # a lookup is one tier's hit: the shared one's
                    self.cache.counts.ram_hits -= 1
                    self.cache.counts.ram_tokens -= covered
                r.cached_tokens = covered
                self.sharing.follow(r.rid, *lead)
            return None
        r.load = load
        if load.match is None:
            return None
        self.sharing.loads(r.rid, load.match.entry.key, load.match.usable)
        return (load.match.entry.key, load.match.usable)

    def release(self, r: BatchRequest) -> None:
        """`r` is held back: its followers start on their own."""
        for f in self.sharing.release(r.rid):
            if (follower := self.requests.get(f.rid)) is not None:
                self.alone(follower)

    def alone(self, r: BatchRequest) -> None:
        """A follower whose leader left, or whose copy would give it nothing: from RAM (the
        same on every rank of a group), or following another."""
        self.start(r, None, counted=False)

    def _joins_load(self, r: BatchRequest, disk: DiskChoice | None) -> DiskChoice | None:
        """The disk entry `r` would load, when another request is loading it already: it
        follows that one (an entry a burst shares is read once). A group's other ranks follow
        rank 0's choice, and decide the same from the same loads in flight."""
        if disk is OWN and self.sharing.loading:
            match = self.cache.disk_choice(r.prompt)
            disk = (match.entry.key, match.usable) if match is not None else None
        if disk is None or disk is OWN or not self.sharing.join_load(r.rid, *disk):
            return None
        return disk
