"""A tensor rank reads and keeps only its share, one layer at a time, including for a family
whose own shard() also splits what lies outside the layers (qwen3_5: its vocabulary-split
head): its peak memory (VmHWM, measured by the kernel) stays well under a single rank's, where
sharding after the whole model was loaded made it higher. Figures: `python -m bench sharding`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import REPO, Daemon
from tests.models.zoo_families import GATED_DELTA_CHECKPOINT

# About 770 MB in float32: big enough that the weights, not the runtime, decide the peak (with
# a real checkpoint's recurrent sub-layers: the zoo's own are sized for a tiny model).
BIG = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 8,
       **GATED_DELTA_CHECKPOINT}


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for pid {pid}")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)")
def test_a_tensor_ranks_peak_memory_is_its_share(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    root = tmp_path_factory.mktemp("big-qwen3_5")
    sets = [f"--set={k}={json.dumps(v)}" for k, v in BIG.items()]
    made = subprocess.run([sys.executable, "-m", "tests.models.zoo", str(root), "qwen3_5", *sets],
                          cwd=REPO, capture_output=True, text=True, timeout=600, check=True)
    model = json.loads(made.stdout.strip().splitlines()[-1])["qwen3_5"]["path"]
    d = Daemon({"ready": "instances", "instances": {
        "one": {"model": model},
        "tensor": {"model": model, "shards": 2, "parallelism": "tensor"},
    }}, name="tensor-memory")
    try:
        d.start()
        one = peak_rss(d.instance("one")["ranks"][0]["pid"])
        ranks = [peak_rss(r["pid"]) for r in d.instance("tensor")["ranks"]]
    finally:
        d.close()
    ratios = [r / one for r in ranks]
    print(f"peak RSS (VmHWM) of each tensor rank / 1 rank's: "  # shown with pytest -s
          f"{', '.join(f'{x:.2f}x' for x in ratios)} (1 rank: {one / 2**20:.0f} MiB)")
    assert all(x < 0.85 for x in ratios), f"tensor ranks' peak / 1 rank's: {ratios}"
