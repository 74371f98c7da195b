"""Runner start: forked from the zygote (the default on Linux) against exec'd (EXOD_ZYGOTE=0), in
the same run, alternated over ROUNDS rounds (ABBA).

One daemon with RUNNERS tiny 1-rank instances, started until every instance is ready; for each
side: the wall time to ready, the CPU-seconds of the daemon, its runners and its zygote at that
moment (/proc/PID/stat), and their memory (the sum of each process's PSS, smaps_rollup: pages
shared copy-on-write with the zygote count once). Medians of the ratios forked / exec'd. Goal:
CPU ≤ 0.5x (the imports, paid once instead of per runner), time to ready and memory ≤ 1.0x.
"""

from __future__ import annotations

import os
import re
import statistics
import time
from typing import Any
from pathlib import Path

from bench.common import model, report
from bench.results import Figure
from tests.harness import Daemon

RUNNERS = 8
ROUNDS = 4
TICK = os.sysconf("SC_CLK_TCK")


def cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def pss_mib(pid: int) -> float:
    found = re.search(r"^Pss:\s+(\d+) kB", Path(f"/proc/{pid}/smaps_rollup").read_text(), re.M)
    return int(found.group(1)) / 1024 if found else 0.0


def start(tiny: str, forked: bool) -> tuple[float, float, float]:
    """(seconds to ready, CPU-seconds, PSS MiB) of a daemon with RUNNERS tiny instances."""
    env = {} if forked else {"EXOD_ZYGOTE": "0"}
    t0 = time.perf_counter()
    d = Daemon({"ready": "instances",
                "instances": {f"one{k}": {"model": tiny} for k in range(RUNNERS)}},
               env=env, name="bench-rstart")
    try:
        d.start()
        took = time.perf_counter() - t0
        assert d.proc is not None
        pids = [d.proc.pid] + [r["pid"] for i in d.status()["instances"] for r in i["ranks"]]
        found = re.search(r"zygote pid (\d+) ready", d.log_text())
        assert bool(found) == forked, "the zygote runs exactly when it should"
        if found:
            pids.append(int(found.group(1)))
        return took, sum(cpu(p) for p in pids), sum(pss_mib(p) for p in pids)
    finally:
        d.close()


def main() -> None:
    tiny = str(model("tiny-4", layers=4))
    ratios: list[tuple[float, float, float]] = []
    per_runner: list[tuple[float, float]] = []
    for r in range(ROUNDS):
        order = [True, False] if r % 2 == 0 else [False, True]
        got = {side: start(tiny, side) for side in order}
        ratios.append(tuple(f / e for f, e in zip(got[True], got[False], strict=True)))
        per_runner.append((got[True][1] / RUNNERS, got[False][1] / RUNNERS))

    def med(i: int) -> float:
        return statistics.median(x[i] for x in ratios)

    def figure(name: str, i: int, goal: str, **extra: Any) -> Figure:
        return Figure(name, med(i), low=min(x[i] for x in ratios),
                      high=max(x[i] for x in ratios), goal=goal, **extra)

    report(f"runner start, {RUNNERS} tiny instances: forked from the zygote / exec'd", [
        figure("CPU-seconds, daemon + runners + zygote, at ready", 1, "<= 0.5x",
               sides={"forked": statistics.median(f for f, _ in per_runner),
                      "exec'd": statistics.median(e for _, e in per_runner)},
               side_unit="CPU-s a runner"),
        figure("time to ready", 0, "<= 1.0x"),
        figure("memory, sum of PSS", 2, "<= 1.0x"),
    ])


if __name__ == "__main__":
    main()
