"""How groups on one host get their ports: exod's choice (exod.core.ports, through the daemon's
registry) against the old one (bind port 0, read the port, close), in the same run.

1. Collisions: GROUPS groups of a 2-rank instance (3 ports each) are given ports one after the
   other while none of their ranks has bound yet (the window in which several groups start at
   once on one daemon). Counted: ports handed to two groups at once. Old: the kernel may hand
   a closed port out again. Goal for exod: 0.
2. Ports inside the kernel's ephemeral range (the pool of outgoing connections' source ports).
   Goal for exod: 0.
3. Time to choose one group's ports, exod's over the old way's. Goal: the choice stays far
   below a runner's start (milliseconds against seconds): ratio reported, no goal.
"""

from __future__ import annotations

import socket
import time
from collections import Counter

from bench.common import report, Row
from bench.results import Figure
from exod.core.ports import Registry
from exod.daemon.rank_addresses import ephemeral_range, free_ports

GROUPS = 300
PORTS = 3  # a 2-rank group: one port per rank and rank 0's control port


def old_way(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def shared(groups: list[list[int]]) -> int:
    counts = Counter(p for g in groups for p in set(g))
    return sum(1 for c in counts.values() if c > 1)


def main() -> None:
    first, last = ephemeral_range()
    t = time.perf_counter()
    old = [old_way(PORTS) for _ in range(GROUPS)]
    old_s = (time.perf_counter() - t) / GROUPS
    registry = Registry()  # as exod.daemon.launch.Launcher.prepare uses it
    t = time.perf_counter()
    for k in range(GROUPS):
        registry.hold(k, free_ports(PORTS, registry.reserved()))
    new_s = (time.perf_counter() - t) / GROUPS
    new = [list(registry.held[k]) for k in range(GROUPS)]
    inside_old = sum(first <= p <= last for g in old for p in g)
    inside_new = sum(first <= p <= last for g in new for p in g)
    rows: list[Row] = [
        ("ephemeral range", f"{first}-{last}"),
        Figure(f"ports shared by groups ({GROUPS} at once), exod", shared(new), unit="",
               text=f"old way {shared(old)}", goal="== 0"),
        Figure("ports inside the ephemeral range, exod", inside_new, unit="",
               text=f"of {GROUPS * PORTS}; old way {inside_old}", goal="== 0"),
        Figure("time per group, exod / old", new_s / old_s,
               sides={"exod": new_s * 1e3, "old": old_s * 1e3}, side_unit="ms"),
    ]
    report("group ports on one host", rows)


if __name__ == "__main__":
    main()
