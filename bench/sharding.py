"""Sharding: the cost of splitting one model across 2 ranks, and the memory it saves, for
four families: llama (its own shard()), qwen2 (a PipelineMixin family), qwen3_moe (MoE) and
qwen3_5 (a shard() that also splits the head; hybrid linear attention).

For each family one daemon serves the same generated float32 model three ways: 1 rank, a
2-rank pipeline and 2-rank tensor parallelism, on this host over the ring backend on loopback.
Printed: decode tokens/s and time to first token (p50/p95) through exod's API, each as a ratio
to the 1-rank instance measured in the same interleaved rounds, each rank's RSS (now, and its
peak while loading and serving) as a ratio to the 1-rank figure, and its PSS against the
1-rank instance's, with its share of the weights and what the group adds to it beyond that
(tests.rank_memory). On 2 cores no speed-up is
expected: the figures show the cost of the split. Then what batching buys a 2-rank group
(bench.group_batching).
"""

from __future__ import annotations

import json
import statistics
import subprocess
from collections.abc import Mapping
from pathlib import Path

from bench import group_batching
from bench.api import Http
from bench.common import CACHE, PY, REPO, model, report, Row
from bench.results import Figure
from exod.core.memory import GROUP_RANK_BYTES
from tests.harness import Daemon
from tests.rank_memory import RankMemory, rank_memory
from tests.models.zoo_families import GATED_DELTA_CHECKPOINT

ROUNDS = 4
TTFT_TOKENS = 4
DECODE_TOKENS = 32
PARAMS = {"layers": 12, "hidden": 1024, "intermediate": 2816, "heads": 16, "kv_heads": 4,
          "vocab": 4096, "shards_files": 2}
# The same shape for the zoo families (config keys); the MoE has 8 experts of 512.
ZOO = {"num_hidden_layers": 12, "hidden_size": 1024, "intermediate_size": 2816,
       "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 64, "vocab_size": 4096}
FAMILIES = {"qwen2": ZOO, "qwen3_moe": {**ZOO, "num_experts": 8, "moe_intermediate_size": 512},
            # qwen3_5: its own shard() also splits the head; a real checkpoint's recurrent
            # sub-layers (the zoo's are sized for a tiny model)
            "qwen3_5": {**ZOO, **GATED_DELTA_CHECKPOINT}}


def p95(xs: list[float]) -> float:
    return sorted(xs)[max(0, round(0.95 * len(xs)) - 1)]


def peak_rss(pid: int) -> int:
    """The most memory the process ever held (the kernel's VmHWM; Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def zoo_model(family: str, config: Mapping[str, object]) -> Path:
    """A zoo family at benchmark size, built once (in a subprocess: we never import mlx)."""
    sets = [f"--set={k}={json.dumps(v)}" for k, v in config.items()]
    res = subprocess.run([PY, "-m", "tests.models.zoo", str(CACHE / "zoo-570m"), family, *sets],
                         capture_output=True, text=True, check=True, cwd=REPO)
    return Path(json.loads(res.stdout.strip().splitlines()[-1])[family]["path"])


def measure(family: str, path: Path) -> list[Row]:
    d = Daemon({"ready": "instances", "instances": {
        "one": {"model": str(path)},
        "pipeline": {"model": str(path), "shards": 2},
        "tensor": {"model": str(path), "shards": 2, "parallelism": "tensor"},
    }}, name=f"bench-shard-{family}")
    try:
        d.start()
        port = int(d.api_url().rsplit(":", 1)[1])
        sides = {name: Http(port, name) for name in ("one", "pipeline", "tensor")}
        ttft: dict[str, list[float]] = {k: [] for k in sides}
        rate: dict[str, list[float]] = {k: [] for k in sides}
        for s in sides.values():
            s.run("warm up", 4)
        names = list(sides)
        for i in range(ROUNDS):
            for name in names[i % 3:] + names[: i % 3]:
                ttft[name].append(sides[name].run(f"Question {i}: count to {i}.", TTFT_TOKENS)[0])
                r = sides[name].run("Tell me a long story.", DECODE_TOKENS)[1]
                if r:
                    rate[name].append(r)
        rss = {i["name"]: [r["rss_bytes"] for r in i["ranks"]] for i in d.status()["instances"]}
        peak = {i["name"]: [peak_rss(r["pid"]) for r in i["ranks"]]
                for i in d.status()["instances"]}
        held = {i["name"]: i for i in d.status()["instances"]}
        pss = {name: rank_memory(path, held["one"], held[name], name)
               for name in ("pipeline", "tensor")}
    finally:
        d.close()
    base_rate = statistics.median(rate["one"])
    base_ttft = statistics.median(ttft["one"])
    base_rss = rss["one"][0]
    rows: list[Row] = []
    for name in sides:
        dec, t50 = statistics.median(rate[name]), statistics.median(ttft[name])
        rows.append(Figure(f"{family} {name}: decode / 1 rank", dec / base_rate,
                           text=f"{dec:.2f} tok/s"))
        rows.append(Figure(f"{family} {name}: TTFT p50 / 1 rank", t50 / base_ttft,
                           text=f"p50 {t50 * 1000:.0f} ms, p95 {p95(ttft[name]) * 1000:.0f} ms"))
        rows.append((f"{family} {name}: RSS per rank", ", ".join(
            f"{b / 2**20:.0f} MiB ({b / base_rss:.2f}x)" for b in rss[name])))
        rows.append((f"{family} {name}: peak RSS per rank (loading included)", ", ".join(
            f"{b / 2**20:.0f} MiB ({b / peak['one'][0]:.2f}x)" for b in peak[name])))
        rows += memory_rows(family, name, pss.get(name, []))
    return rows


def memory_rows(family: str, name: str, ranks: list[RankMemory]) -> list[Row]:
    """Each rank's PSS against the 1-rank instance's, with its share of the weights beside it
    (goal for a pipeline rank of 2: under 0.6x), and what the group adds to it (counted by
    memory admission and the planner as GROUP_RANK_BYTES; PSS moves by a few tens of MiB from
    run to run, so this one has no goal)."""
    rows: list[Row] = []
    for k, r in enumerate(ranks):
        rows.append(Figure(f"{family} {name}: rank {k} PSS / 1 rank", r.ratio,
                           goal="< 0.6x" if name == "pipeline" else None,
                           text=f"{r.pss / 2**20:.0f} MiB of {r.one_pss / 2**20:.0f}; "
                                f"its share of the weights {r.share:.2f}x"))
        rows.append(Figure(f"{family} {name}: rank {k} memory beyond its share",
                           r.beyond_share / 2**20, unit="MiB",
                           text="PSS less its weights, less a lone runner's beside its own; "
                                f"admission counts {GROUP_RANK_BYTES / 2**20:.0f} MiB"))
    return rows


def main() -> None:
    rows = measure("llama", model("shard-570m", **PARAMS))
    for family, config in FAMILIES.items():
        rows += measure(family, zoo_model(family, config))
    report(f"sharding: 12-layer float32 models (hidden 1024), {ROUNDS} interleaved rounds, "
           "ring backend on loopback, 2 cores", rows)
    group_batching.main()


if __name__ == "__main__":
    main()
