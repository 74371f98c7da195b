"""A pipeline rank holds its share of the weights and little more: its PSS (pages shared with
the zygote and the other runners counted in part) stays under 0.6x the 1-rank instance's for
half the weights, and beyond its share it holds what a lone runner holds, plus what memory
admission and the planner count for a rank of a group (GROUP_RANK_BYTES: mx.distributed's
buffers). Stand-in layers hold no weights: where a stand-in's MLP was read (the CPU activation
split tried it), rank 0 held one more MLP, which fails both bounds. Figures: `python -m bench
sharding`."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from exod.core.memory import GROUP_RANK_BYTES
from tests.harness import Daemon
from tests.rank_memory import rank_memory

# About 1 GB in float32, so that the weights, not the runtime every runner has, make most of a
# rank's memory; a stand-in's MLP is 66 MiB.
BIG = {"layers": 12, "hidden": 1024, "intermediate": 5632, "heads": 16, "kv_heads": 4,
       "vocab": 4096, "shards_files": 2}
# PSS moves by a few tens of MiB from run to run (malloc's arenas, OpenBLAS's buffers): the
# margin beyond GROUP_RANK_BYTES.
NOISE = 32 * 2**20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)")
def test_a_pipeline_rank_holds_its_share_and_little_more(
        daemons: Callable[..., Daemon], tiny_model_factory: Callable[..., Path]) -> None:
    model = tiny_model_factory(**BIG)
    d = daemons({"ready": "instances", "instances": {
        "one": {"model": str(model)},
        "pipeline": {"model": str(model), "shards": 2},
    }}, name="rank-memory")
    d.start()
    ranks = rank_memory(model, d.instance("one"), d.instance("pipeline"))
    print("pipeline rank PSS / 1 rank's: " + ", ".join(  # shown with pytest -s
        f"{r.ratio:.3f} ({r.pss / 2**20:.0f} of {r.one_pss / 2**20:.0f} MiB; its share of "
        f"the weights {r.share:.2f}x, {r.beyond_share / 2**20:.1f} MiB beyond it)"
        for r in ranks))
    assert all(abs(r.share - 0.5) < 0.01 for r in ranks), [r.share for r in ranks]
    assert all(r.ratio < 0.6 for r in ranks), [r.ratio for r in ranks]
    assert all(r.beyond_share < GROUP_RANK_BYTES + NOISE for r in ranks), \
        [r.beyond_share / 2**20 for r in ranks]
