"""The batch engine's side of shared prefixes (exod.runner.serving.shared_prefix decides who
follows whom): before each step, the followers that are due start from a copy of their leader's
cache, taken out of mlx-lm's batch and rewound to their own shared part; the followers of a
request that leaves before they got theirs start on their own."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from mlx_lm.models.cache import trim_prompt_cache

from exod.runner.prompt_cache.tiers import PromptCache
from exod.runner.serving.batch_request import BatchRequest
from exod.runner.serving.shared_prefix import Follower, Sharing, common_prefix
from exod.wire import messages as m

# Into the batch, from a cache covering that many prompt tokens.
Insert = Callable[[BatchRequest, "list[Any] | None", int], None]


class Forks:
    """`requests`: the engine's, by id (loading, waiting or in the batch). `insert`: into the
    batch from a cache. `alone`: start a request as if just admitted, from what the prompt
    cache holds (RAM only: every rank of a group does the same) or following another."""

    def __init__(self, sharing: Sharing, requests: dict[str, BatchRequest], cache: PromptCache,
                 insert: Insert, alone: Callable[[BatchRequest], None]) -> None:
        self.sharing, self.requests, self.cache = sharing, requests, cache
        self.insert, self.alone = insert, alone

    def due(self, gen: Any, chunk: int) -> list[m.Event]:
        """Before a step of `gen` that prefills at most `chunk` tokens of a prompt: the followers
        whose shared part their leader's cache holds (or would run past) start; the others hear
        how far it is (progress, which the daemon's hang watch counts)."""
        events: list[m.Event] = []
        for rid in self.sharing.leaders:
            lead = self.requests.get(rid)
            if lead is None or lead.uid < 0:
                continue  # its disk entry is still on its way
            due = self.sharing.due(rid, lead.in_cache, chunk)
            if due:
                self._fork(gen, lead, due)
            for f in self.sharing.followers.get(rid, []):
                r = self.requests[f.rid]
                got = min(lead.in_cache, f.upto)
                if got > r.prefilled and r.out is not None:
                    r.prefilled = got
                    events.append(m.Prefill(r.rid, got, r.prompt_tokens))
        return events

    def gone(self, r: BatchRequest) -> None:
        """`r` left (done, cancelled, failed): no longer followed, no longer following."""
        self.sharing.drop(r.rid)
        self.sharing.loaded(r.rid)
        for f in self.sharing.release(r.rid):
            if (follower := self.requests.get(f.rid)) is not None:
                self.alone(follower)

    def _fork(self, gen: Any, lead: BatchRequest, due: list[Follower]) -> None:
        (cache, held), = gen.extract_cache([lead.uid]).values()
        held = list(held)
        # Still its prompt: a prefix that later prompts find in the cache too.
        if self.cache.enabled and len(held) <= len(lead.prompt):
            self.cache.store(held, copy.deepcopy(cache))
        for f in due:
            r = self.requests[f.rid]
            share = min(f.upto, len(held), common_prefix(held, r.prompt))
            extra = len(held) - share
            if share <= r.cached_tokens or (extra and not self.sharing.exact):
                self.alone(r)  # nothing to gain from it
                continue
            mine = copy.deepcopy(cache)
            if extra:
                trim_prompt_cache(mine, extra)
            if r.out is not None:  # a warm-up is no request's hit
                self.cache.counts.shared_hits += 1
                self.cache.counts.shared_tokens += share
            self.insert(r, mine, share)
