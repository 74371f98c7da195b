"""A cluster of exods (issue 49; docs/cluster.md). A list of figures, each bringing up the
nodes it needs:

- proxy: a 2-rank pipeline across two exods, rank 0 on host-a. Streamed chats sent to host-b's
  API (sent on to host-a's: "Any node serves") against the same sent to host-a's: tokens a
  second after the first token, and the time to the first token, through / direct; goal
  >= 0.97x for tok/s and <= 1/0.97x for the time to first token. Each exod in its own network
  namespace joined by a veth pair (as root), the client in host-b's; else two daemons on
  loopback, host-b finding host-a's API port by discovery. Rounds (EXOD_BENCH_ROUNDS,
  default 6) of pairs (EXOD_BENCH_PER, default 5), each pair a request to each side back to
  back, in ABBA order; a round's ratio is the median of its pairs'; each figure is the median
  of the rounds' ratios, with their range.
- model files from a peer against a plain copy over the same link (bench.cluster_files).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench import cluster_files
from bench.common import REPO, model, report
from bench.results import Figure, note
from exod.core.keys import hash_text
from tests.harness import Daemon, free_port
from tests.netns import NetnsUnavailable, TwoHosts

ROUNDS = 6
PER = 5
MAX_TOKENS = 96
GOAL = 0.97
API_PORT = 52415  # in a namespace each node has its own ports
SECRET = "bench-secret"  # an API reachable from other machines needs a key


def _instance(model_dir: Path, key: Path, a: str, b: str) -> dict[str, Any]:
    return {"model": str(model_dir), "shards": 2, "port_base": 6330, "peer_timeout": "10s",
            "cluster_key_file": str(key),
            "hosts": [{"name": "host-a", "address": a}, {"name": "host-b", "address": b}]}


@contextmanager
def two_nodes(model_dir: Path, tmp: Path) -> Iterator[tuple[dict[str, str], list[str], str]]:
    """Two exods, one 2-rank pipeline across them, ready: the client's URLs ({"direct": host-a's
    API, "through": host-b's}), the argv prefix that runs the client where it reaches them,
    and how they are joined (words)."""
    key = tmp / "cluster.key"
    key.write_text("0123456789abcdef" * 4)
    key.chmod(0o600)
    try:
        hosts: TwoHosts | None = TwoHosts().__enter__()
    except NetnsUnavailable:
        hosts = None
    made: list[Daemon] = []
    try:
        if hosts is not None:
            inst = _instance(model_dir, key, hosts.a.address, hosts.b.address)
            for h in (hosts.a, hosts.b):
                d = Daemon({"node": {"name": h.name}, "api": {
                    "listen": f"{h.address}:{API_PORT}",
                    "keys": [{"name": "bench", "hash": hash_text(SECRET)}]},
                    "instances": {"pp": inst}}, name=f"bench-cluster-{h.name}")
                made.append(d)
                d.start(prefix=tuple(h.prefix()))
            urls = {"direct": f"http://{hosts.a.address}:{API_PORT}",
                    "through": f"http://{hosts.b.address}:{API_PORT}"}
            where, how = list(hosts.b.prefix()), "network namespaces joined by a veth pair"
        else:
            inst = _instance(model_dir, key, "127.0.0.1", "127.0.0.1")
            ends = {"host-a": free_port(), "host-b": free_port()}
            for name, other in (("host-a", "host-b"), ("host-b", "host-a")):
                d = Daemon({"node": {"name": name}, "api": {"listen": "127.0.0.1:0"},
                            "cluster": {"key_file": str(key), "mdns": False, "interval": "300ms",
                                        "listen": f"127.0.0.1:{ends[name]}",
                                        "peers": [f"127.0.0.1:{ends[other]}"]},
                            "instances": {"pp": inst}}, name=f"bench-cluster-{name}")
                made.append(d)
                d.start()
            _member(made[1])
            urls = {"direct": made[0].api_url(), "through": made[1].api_url()}
            where, how = [], "two daemons on loopback (no network namespaces here)"
        for d in made:
            d.until_state("pp", "ready", timeout=600)
        yield urls, where, how
    finally:
        for d in made:
            d.terminate()
            d.close()
        if hosts is not None:
            hosts.close()


def _member(d: Daemon) -> None:
    """Poll until `d` has heard another node (joining changes no instance: no watch event)."""
    deadline = time.monotonic() + 120
    while not any(n["state"] == "member" for n in (d.status()["cluster"] or {}).get("nodes", [])):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the other node was never heard:\n{d.log_text()}")
        time.sleep(0.1)


def proxy() -> None:
    rounds = int(os.environ.get("EXOD_BENCH_ROUNDS") or ROUNDS)
    per = int(os.environ.get("EXOD_BENCH_PER") or PER)
    path = model("cluster-8x256", layers=8, hidden=256, intermediate=768, heads=4, kv_heads=2)
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp, \
            two_nodes(path, Path(tmp)) as (urls, where, how):
        args = {"sides": urls, "model": "pp", "rounds": rounds, "per": per,
                "max_tokens": MAX_TOKENS, "key": SECRET}
        res = subprocess.run([*where, sys.executable, "-m", "bench.cluster_client",
                              json.dumps(args)], capture_output=True, text=True, cwd=REPO,
                             check=False, timeout=3600)
        if res.returncode != 0:
            raise RuntimeError(f"bench.cluster_client failed:\n{res.stderr}")
        got: dict[str, list[list[list[float]]]] = json.loads(res.stdout.splitlines()[-1])
    pairs = [list(zip(d, t, strict=True))
             for d, t in zip(got["direct"], got["through"], strict=True)]
    # Each round's figure: the median of its pairs' ratios. The time to the first token as a
    # speed (direct / through), so that >= 0.97x reads as for tok/s.
    tps = [statistics.median(t[1] / d[1] for d, t in rnd) for rnd in pairs]
    ttft = [statistics.median(d[0] / t[0] for d, t in rnd) for rnd in pairs]
    med = {side: {"ttft": statistics.median(x[0] for rnd in rounds_ for x in rnd),
                  "tps": statistics.median(x[1] for rnd in rounds_ for x in rnd)}
           for side, rounds_ in got.items()}
    note(f"2-rank pipeline across {how}; {rounds} rounds of {per} pairs (ABBA) of streamed "
         f"chats of {MAX_TOKENS} tokens")
    report("cluster: a 2-rank pipeline across two exods, asked through the node without rank 0 "
           "against rank 0's own", [
        Figure("tok/s through host-b / host-a direct", statistics.median(tps), rounds=tps,
               goal=f">= {GOAL}x", sides={"through": med["through"]["tps"],
                                          "direct": med["direct"]["tps"]}, side_unit="tok/s",
               text=f"{med['through']['tps']:.1f} / {med['direct']['tps']:.1f} tok/s"),
        Figure("first token: direct time / through time", statistics.median(ttft),
               rounds=ttft, goal=f">= {GOAL}x",
               sides={"through": med["through"]["ttft"] * 1000,
                      "direct": med["direct"]["ttft"] * 1000}, side_unit="ms",
               text=f"{med['through']['ttft'] * 1000:.1f} / "
                    f"{med['direct']['ttft'] * 1000:.1f} ms"),
    ])


# Each brings up the nodes it needs and reports its figures (bench.common.report); more join
# the list (a node's loss).
FIGURES: list[Callable[[], None]] = [proxy, cluster_files.main]


def main() -> None:
    for figures in FIGURES:
        figures()


if __name__ == "__main__":
    main()
