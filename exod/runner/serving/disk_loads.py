"""The batch engine's prompts waiting for their prompt cache entry to be read from disk: a
bounded number of bytes a step (LOAD_STEP), like prefill, so a cancel or a stop ends a load
between two steps. On a group's ranks, `agree` (an all-reduce) says when every rank has read
the entry; if one rank cannot, it is a miss on every rank."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from exod.wire import messages as m
from exod.runner.prompt_cache.tiers import PromptCache
from exod.runner.serving.batch_request import BatchRequest

LOAD_STEP = 128 << 20  # bytes of disk entries read in one step at most (about 0.2 s here)
CHECK_WAIT = 0.05  # seconds a step with nothing else to do waits for a file being checked

# For each flag, whether it holds on every rank of the group (an all-reduce).
Agree = Callable[[list[bool]], list[bool]]
# Into the batch, from a cache (None: nothing) covering that many prompt tokens.
Insert = Callable[[BatchRequest, "list[Any] | None", int], None]


def step_loads(requests: list[BatchRequest], cache: PromptCache, agree: Agree | None,
               insert: Insert, *, stepping: bool) -> list[m.Event]:
    """Read the disk entries under way (LOAD_STEP bytes in all), then start in the batch each
    one every rank has read, and from RAM or nothing each one a rank could not read.
    `stepping`: the batch has requests of its own to step."""
    loading = [r for r in requests if r.load is not None]
    if not loading:
        return []
    budget = LOAD_STEP
    for r in loading:
        assert r.load is not None
        budget -= r.load.advance(max(budget, 0))
    if budget == LOAD_STEP and not stepping:
        # Only files being checked and nothing else to step: wait for one a little,
        # rather than spin (a step stays bounded: a stop is seen as soon as before).
        waits = [r.load.job for r in loading if r.load is not None and r.load.job]
        if waits:
            waits[0].done.wait(CHECK_WAIT)
    ready = [r.load is not None and r.load.ready for r in loading]
    ok = [r.load is not None and r.load.failed is None for r in loading]
    if agree is not None:
        flags = agree(ready + ok)
        ready, ok = flags[: len(loading)], flags[len(loading):]
    events: list[m.Event] = []
    for r, all_ready, all_ok in zip(loading, ready, ok, strict=True):
        load = r.load
        assert load is not None
        if not all_ok:
            r.load = None
            cache.loaded(load, used=False)  # rank 0's may be whole: still no hit
            insert(r, *cache.ram_only(r.prompt))
        elif all_ready:
            r.load = None
            cache.loaded(load)
            assert load.cache is not None and load.match is not None
            insert(r, load.cache, load.match.usable)
        elif r.out is not None and load.match is not None:
            done = int(load.progress * load.match.usable)
            if done > r.prefilled or not r.prefilled:  # progress, for the hang watch
                r.prefilled = max(done, 1)
                events.append(m.Prefill(r.rid, done, r.prompt_tokens))
    return events
