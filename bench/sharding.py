"""Sharding: the cost of splitting one model across 2 ranks, and the memory it saves.

One daemon serves the same generated model (~570 MB, float32) three ways: 1 rank, a 2-rank
pipeline and 2-rank tensor parallelism, all on this host over the ring backend on loopback.
Printed: decode tokens/s and time to first token (p50/p95) through exod's API, each as a ratio
to the 1-rank instance measured in the same interleaved rounds, and each rank's RSS as a ratio
to the 1-rank RSS. On 2 cores no speed-up is expected: the figures show the cost of the split.
"""

from __future__ import annotations

import statistics

from bench.api import Http
from bench.common import model, report
from tests.harness import Daemon

ROUNDS = 8
TTFT_TOKENS = 4
DECODE_TOKENS = 64
PARAMS = {"layers": 12, "hidden": 1024, "intermediate": 2816, "heads": 16, "kv_heads": 4,
          "vocab": 4096, "shards_files": 2}


def p95(xs: list[float]) -> float:
    return sorted(xs)[max(0, round(0.95 * len(xs)) - 1)]


def main() -> None:
    path = str(model("shard-570m", **PARAMS))
    d = Daemon({"ready": "instances", "instances": {
        "one": {"model": path},
        "pipeline": {"model": path, "shards": 2},
        "tensor": {"model": path, "shards": 2, "parallelism": "tensor"},
    }}, name="bench-shard")
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
    finally:
        d.close()
    base_rate = statistics.median(rate["one"])
    base_ttft = statistics.median(ttft["one"])
    base_rss = rss["one"][0]
    rows = []
    for name in sides:
        dec, t50 = statistics.median(rate[name]), statistics.median(ttft[name])
        rows.append((f"{name}: decode", f"{dec:6.2f} tok/s = {dec / base_rate:.2f}x 1 rank"))
        rows.append((f"{name}: TTFT p50 / p95", f"{t50 * 1000:6.0f} / {p95(ttft[name]) * 1000:.0f}"
                     f" ms = {t50 / base_ttft:.2f}x 1 rank"))
        rows.append((f"{name}: RSS per rank", ", ".join(
            f"{b / 2**20:.0f} MiB ({b / base_rss:.2f}x)" for b in rss[name])))
    report(f"sharding: {PARAMS['layers']}-layer ~570 MB model, {ROUNDS} interleaved rounds, "
           "ring backend on loopback, 2 cores", rows)


if __name__ == "__main__":
    main()
