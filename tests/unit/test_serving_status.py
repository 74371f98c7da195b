"""The engine's figures in `exoctl status`: the hit rate the JSON adds, the table's line."""

from __future__ import annotations

from dataclasses import replace

from exod.cli.table import serving_note
from exod.wire.control_status import SpeculativeStatus
from exod.wire.messages import ServingReport
from exod.daemon.status import serving_status

BATCH = ServingReport(batching="continuous", width=8, active=3, prefill_step=256, cache_entries=2,
                cache_bytes=3 * 2**20, cache_max_bytes=2**30, cache_lookups=4, cache_hits=1,
                cached_tokens=40, prompt_tokens=200)


def test_hit_rate_is_hits_per_lookup_and_null_before_any() -> None:
    out = serving_status(BATCH)
    assert out is not None and out.prompt_cache is not None and out.prompt_cache.hit_rate == 0.25
    fresh = serving_status(replace(BATCH, cache_lookups=0, cache_hits=0))
    assert fresh is not None and fresh.prompt_cache is not None
    assert fresh.prompt_cache.hit_rate is None
    assert serving_status(None) is None


def test_table_line_shows_batch_and_cache_or_why_there_is_no_batch() -> None:
    assert serving_note(serving_status(BATCH)) == (
        "batch 3/8, prompt cache 2 entries 3MiB, hit rate 25%")
    off = replace(BATCH, cache_max_bytes=0)
    assert serving_note(serving_status(off)) == "batch 3/8, no prompt cache"
    why = "one request at a time: a multi-rank group's forward carries one sequence"
    assert serving_note(serving_status(ServingReport(batching=why, width=2, active=0))) == why
    assert serving_note(None) == ""


def test_the_disk_tier_has_its_own_hit_rate_and_its_part_of_the_line() -> None:
    on_disk = replace(BATCH, disk_max_bytes=8 << 30, disk_entries=5, disk_bytes=410 * 2**20,
                      disk_hits=2, disk_cached_tokens=900, disk_load_ms=1250, disk_writes=6,
                      disk_state="ready")
    out = serving_status(on_disk)
    assert out is not None and out.prompt_cache is not None
    disk = out.prompt_cache.disk
    assert disk is not None and (disk.hits, disk.hit_rate, disk.load_s) == (2, 0.5, 1.25)
    assert serving_note(out) == ("batch 3/8, prompt cache 2 entries 3MiB, hit rate 25%; on "
                                 "disk 5 entries 410MiB, hit rate 50%")
    hashing = serving_status(replace(on_disk, disk_state="hashing the weights (1.0 GiB, once)"))
    assert serving_note(hashing).endswith("hit rate 50% (hashing the weights (1.0 GiB, once))")
    plain = serving_status(BATCH)
    assert plain is not None and plain.prompt_cache is not None
    assert plain.prompt_cache.disk is None  # no disk tier


def test_speculative_figures_are_accepted_per_drafted_and_absent_without_a_draft() -> None:
    why = "one request at a time: speculative decoding; 4 of 6 drafted tokens accepted (67%)"
    spec = ServingReport(batching=why, width=1, active=0, draft_tokens=2, drafted=6,
                         draft_accepted=4)
    out = serving_status(spec)
    assert out is not None and out.speculative == SpeculativeStatus(2, 6, 4, 0.6667)
    fresh = serving_status(replace(spec, drafted=0, draft_accepted=0))
    assert fresh is not None and fresh.speculative == SpeculativeStatus(2, 0, 0, None)
    plain = serving_status(BATCH)
    assert plain is not None and plain.speculative is None
    batched = serving_status(replace(BATCH, draft_tokens=3, drafted=60, draft_accepted=40))
    assert batched is not None and batched.speculative == SpeculativeStatus(3, 60, 40, 0.6667)
    assert serving_note(batched).endswith("; drafts 3 a step, 40 of 60 accepted (67%)")
    assert serving_note(replace(batched, speculative=SpeculativeStatus(3, 0, 0, None))
                        ).endswith("; drafts 3 a step")
    assert "drafts" not in serving_note(plain)
