"""What a rank of a group really holds, against its share: read by `bench sharding` and
tests/integration/test_rank_memory.py on a daemon running a model as 1 rank and as a group.

A rank's memory is its PSS (proportional set size, /proc/PID/smaps_rollup: a page shared with
the zygote or another runner counts in part), which the pages mlx, Python and the zygote share
would inflate as RSS. Its share is the bytes of the weights it holds, from the safetensors
headers as memory admission counts them (exod.core.memory). What it holds beyond its share is
its PSS, less its weights, less what a lone runner holds beside its own weights: the memory a
group adds to a rank, which `exod.core.memory.GROUP_RANK_BYTES` counts. Linux (reads /proc).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exod.core.memory import model_tensors, run_dtype, weight_bytes
from exod.core.shards import Shard


def pss_bytes(pid: int) -> int:
    found = re.search(r"^Pss:\s+(\d+) kB", Path(f"/proc/{pid}/smaps_rollup").read_text(), re.M)
    if found is None:
        raise AssertionError(f"no Pss in /proc/{pid}/smaps_rollup")
    return int(found.group(1)) * 1024


@dataclass(frozen=True)
class RankMemory:
    pss: int  # the rank's PSS
    weights: int  # the bytes of the weights it holds
    one_pss: int  # the lone runner's PSS, of the same model
    one_weights: int  # the whole model's weights

    @property
    def ratio(self) -> float:
        return self.pss / self.one_pss

    @property
    def share(self) -> float:
        return self.weights / self.one_weights

    @property
    def beyond_share(self) -> int:
        """What the group adds: the rank's memory past its weights, past a lone runner's."""
        return (self.pss - self.weights) - (self.one_pss - self.one_weights)


def rank_memory(model: Path, one: dict[str, Any], group: dict[str, Any],
                parallelism: str = "pipeline", on_cpu: bool = True) -> list[RankMemory]:
    """Each rank of `group` (a status's instance) against `one` (the same model on 1 rank)."""
    tensors = model_tensors(model)
    config = json.loads((model / "config.json").read_text())
    tied = bool(config.get("tie_word_embeddings", False))
    cast = run_dtype("auto", on_cpu)
    total = group["ranks"][0]["layers_total"]
    whole = weight_bytes(tensors, Shard(0, 1, 0, total, total), "pipeline", cast, tied)
    one_pss = pss_bytes(one["ranks"][0]["pid"])
    world = len(group["ranks"])
    out = []
    for r in group["ranks"]:
        start, end = r["layers"]
        shard = Shard(r["rank"], world, start, end, total)
        out.append(RankMemory(pss_bytes(r["pid"]),
                              weight_bytes(tensors, shard, parallelism, cast, tied),
                              one_pss, whole))
    return out
