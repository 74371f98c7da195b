"""What the batch engine reports of itself in a rank's status (`ServingReport`): its batch, its
prompt cache's tiers and, with a draft model, the drafted tokens and those accepted."""

from __future__ import annotations

from exod.wire import messages as m
from exod.runner.prompt_cache.tiers import PromptCache
from exod.runner.serving.gen_options import Draft


def serving_stats(cache: PromptCache, *, width: int, active: int, prefill_step: int,
                  cache_bytes: int, draft: Draft | None = None,
                  fair: bool = False) -> m.ServingReport:
    c, disk, ram = cache.counts, cache.disk, cache.ram
    return m.ServingReport(
        batching="continuous", width=width, active=active,
        prefill_step=prefill_step, cache_max_bytes=cache_bytes,
        cache_entries=len(ram), cache_bytes=int(ram.nbytes),
        cache_lookups=c.lookups, cache_hits=c.ram_hits, cached_tokens=c.ram_tokens,
        prompt_tokens=c.prompt_tokens,
        disk_max_bytes=disk.index.budget if disk is not None else 0,
        disk_entries=len(disk.index) if disk is not None else 0,
        disk_bytes=disk.index.nbytes if disk is not None else 0,
        disk_hits=c.disk_hits, disk_cached_tokens=c.disk_tokens,
        disk_load_ms=round(c.disk_load_s * 1000),
        disk_writes=disk.stats.writes if disk is not None else 0,
        disk_errors=disk.stats.errors if disk is not None else 0,
        disk_state=disk.state[:500] if disk is not None else "",
        shared_hits=c.shared_hits, shared_tokens=c.shared_tokens,
        draft_tokens=draft.tokens if draft is not None else 0,
        drafted=draft.drafted if draft is not None else 0,
        draft_accepted=draft.accepted if draft is not None else 0, fair=fair)
