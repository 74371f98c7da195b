"""What a 2-rank group costs to bring up on one host, against single runners in the same run.

1. A rank that has loaded waits for its slower peer: rank 1 of a pipeline is frozen (SIGSTOP)
   as it starts loading its 40 layers, and the CPU that rank 0 uses while it waits is measured
   over a window, as a share of one core. Goal: ≤ 0.15 (an MLX all_sum there polled ~0.6,
   taken from the peer that is loading on the same host).
2. Time to ready: GROUPS tiny 2-rank pipelines against 2 x GROUPS tiny 1-rank instances (the
   same number of runner processes) on one daemon each, alternated over ROUNDS rounds; the
   median ratio per runner. What a group adds (its formation, the wait for every rank, the
   first token through both ranks) over importing mlx-lm and loading. No goal: printed so a
   change that makes groups costly to start shows.
"""

from __future__ import annotations

import statistics
import time

from bench.common import model, report
from bench.results import Figure
from tests.harness import Daemon, waiting_for_a_frozen_peer

GROUPS = 6
ROUNDS = 2
WINDOW = 2.0


def waiting_share() -> float:
    path = model("barrier-41x512", layers=41, hidden=512, intermediate=2048, heads=8,
                 kv_heads=8)
    d = Daemon({"instances": {"g": {"model": str(path), "shards": 2, "layers": [1, 40]}}},
               name="bench-wait")
    try:
        d.start()
        share, _ = waiting_for_a_frozen_peer(d, "g", WINDOW)
        return share
    finally:
        d.close()


def time_to_ready(instances: dict[str, dict[str, object]]) -> float:
    t0 = time.perf_counter()
    d = Daemon({"ready": "instances", "instances": instances}, name="bench-start")
    try:
        d.start()
        return time.perf_counter() - t0
    finally:
        d.close()


def main() -> None:
    share = waiting_share()
    tiny = str(model("tiny-4", layers=4))
    singles = {f"one{k}": {"model": tiny} for k in range(2 * GROUPS)}
    groups = {f"pipe{k}": {"model": tiny, "shards": 2} for k in range(GROUPS)}
    ratios = []
    for r in range(ROUNDS):
        order = [singles, groups] if r % 2 == 0 else [groups, singles]
        took = {id(c): time_to_ready(c) for c in order}
        ratios.append(took[id(groups)] / took[id(singles)])
    report("bringing groups up on one host", [
        Figure("share of a core used by a rank waiting for its frozen peer", share, unit="",
               goal="<= 0.15"),
        Figure(f"time to ready, {GROUPS} 2-rank groups / {2 * GROUPS} single runners",
               statistics.median(ratios), rounds=ratios),
    ])


if __name__ == "__main__":
    main()
