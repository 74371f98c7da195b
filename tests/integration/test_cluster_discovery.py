"""Discovery for real: exods in network namespaces on one Linux bridge, as machines on a LAN.

Three nodes with one key find each other by mDNS; a node with another key and a stranger (an
mDNS announcer with no key) are there too, and are listed foreign, never members. Then the test
plays an attacker on the LAN: a forged record that names a member, a hello sent twice, a
member's answer sent again as a hello, a record from too long ago: each is refused, one log line
and one row each however often it comes, and nothing of the members changes. Last, with mDNS off,
seed addresses alone form the cluster.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from exod.core.nodes import NodeInfo
from exod.wire.announce import Record, cluster_id, hello_line, new_nonce, seal
from tests.harness import REPO, SAFETY, Daemon
from tests.netns import Bridge, Host, NetnsUnavailable

GIB = 2**30
PORT = 52416  # every node on its own host: the default port
SKEW = 30.0


def key_file(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


def node_config(host: Host, key: Path, memory: int, **cluster: Any) -> dict[str, Any]:
    return {"node": {"name": host.name}, "api": {"listen": ""},
            "cluster": {"key_file": str(key), "interval": "300ms", "peer_timeout": "5s",
                        "max_clock_skew": f"{SKEW:g}s", "test_memory": memory, **cluster}}


def cluster_of(d: Daemon) -> dict[str, Any]:
    c = d.status()["cluster"]
    assert c is not None
    return c


def until(d: Daemon, pred: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
    """Poll the daemon's cluster status until `pred` holds (a bound against hangs only)."""
    deadline = time.monotonic() + SAFETY
    while time.monotonic() < deadline:
        c = cluster_of(d)
        if pred(c):
            return c
        time.sleep(0.1)  # polling: nothing in the status to wait on
    raise AssertionError(f"timed out waiting for {what}:\n{json.dumps(cluster_of(d), indent=1)}"
                         f"\n--- log ---\n{d.log_text()}")


def members(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n["node_id"]: n for n in c["nodes"] if n["state"] == "member"}


def foreign_at(c: dict[str, Any], address: str) -> list[dict[str, Any]]:
    return [n for n in c["nodes"] if n["state"] == "foreign" and n["address"] == address]


def send(host: Host, to: Host, line: bytes) -> dict[str, Any]:
    """One exchange's line sent from `host`'s namespace (the attacker's machine); the answer."""
    res = subprocess.run([*host.prefix(), sys.executable, "-m", "tests.cluster_stranger", "send",
                          to.address, str(PORT)], input=line, capture_output=True,
                         timeout=SAFETY, cwd=REPO, check=True)
    return dict(json.loads(res.stdout))


def refusals_logged(d: Daemon, fragment: str) -> int:
    """Lines logging an announcement this node refused, whose reason has `fragment`. Not those
    saying a peer refused this node's own (a row of another kind, whose reason quotes the
    peer's: whether one is logged yet depends on when this node first asked that peer)."""
    return sum(1 for line in d.log_text().splitlines()
               if "refused an announcement" in line and fragment in line
               and "refused this node's announcement" not in line)


@pytest.fixture
def bridge() -> Iterator[Bridge]:
    try:
        b = Bridge(5).__enter__()
    except NetnsUnavailable as e:
        pytest.fail(str(e))  # CI runs as root: this must work there
    try:
        yield b
    finally:
        b.close()


def test_three_nodes_find_each_other_and_nothing_else(
        daemons: Callable[..., Daemon], bridge: Bridge, tmp_path: Path) -> None:
    key = key_file(tmp_path / "cluster.key", "0123456789abcdef" * 4)
    other = key_file(tmp_path / "other.key", "fedcba9876543210" * 4)
    h1, h2, h3, h4, h5 = bridge.hosts
    nodes = [daemons(node_config(h, key, (i + 1) * 4 * GIB), name=h.name)
             for i, h in enumerate((h1, h2, h3))]
    outsider = daemons(node_config(h4, other, 64 * GIB), name=h4.name)
    stranger = subprocess.Popen(
        [*h5.prefix(), sys.executable, "-m", "tests.cluster_stranger", "announce", h5.address,
         str(PORT), "stranger"], stdout=subprocess.PIPE, cwd=REPO)
    try:
        assert stranger.stdout is not None and stranger.stdout.readline() == b"ready\n"
        for d, h in zip([*nodes, outsider], (h1, h2, h3, h4), strict=True):
            d.start(prefix=tuple(h.prefix()))
        ids = [cluster_of(d)["announced"]["node_id"] for d in nodes]
        outsider_id = cluster_of(outsider)["announced"]["node_id"]

        # Each of the three lists the other two as members, with what they announce, and the
        # node of another key and the stranger as foreign (the stranger proves no key at all).
        for i, d in enumerate(nodes):
            c = until(d, lambda c: len(members(c)) == 2 and foreign_at(c, h4.address)
                      and foreign_at(c, h5.address), f"{d.dir.name}'s cluster")
            got = members(c)
            assert set(got) == set(ids) - {ids[i]}
            for j, node_id in enumerate(ids):
                if j != i:
                    info = got[node_id]["info"]
                    assert info["memory_total"] == (j + 1) * 4 * GIB
                    assert info["name"] == f"node-{j + 1}" and info["backend"] == "cpu"
                    assert info["addresses"] == [(h1, h2, h3)[j].address]
                    assert info["control_port"] == PORT
            assert outsider_id not in got and "stranger" not in got
            assert "another cluster's key" in foreign_at(c, h4.address)[0]["reason"]
            unsigned = [n for n in foreign_at(c, h5.address) if n["node_id"] == "stranger"]
            assert unsigned and unsigned[0]["reason"].startswith("unsigned"), c
            # The links among the three, as each measured its own: six, all timed.
            c = until(d, lambda c: len(c["links"]) == 6, "every link to be timed")
            assert all(link["seconds_per_mib"] > 0 for link in c["links"])
        # The node of another key sees the three as foreign too, and has no member.
        c = until(outsider, lambda c: all(foreign_at(c, h.address) for h in (h1, h2, h3)),
                  "the outsider's refusals")
        assert not members(c)
        # Each refusal once in the log, however many announcements it refused.
        for d in nodes:
            assert refusals_logged(d, "another cluster's key") == 1
            assert refusals_logged(d, "unsigned") == 1
        table = nodes[0].ctl("cluster").stdout
        assert "foreign" in table and "unsigned" in table and "node-2" in table

        attack(nodes, ids, key, h1, h2, h5)
    finally:
        stranger.kill()
        stranger.wait()


def attack(nodes: list[Daemon], ids: list[str], key: Path, h1: Host, h2: Host,
           h5: Host) -> None:
    """Forged and replayed announcements, from the stranger's machine; nothing changes."""
    secret = key.read_bytes().strip()
    n1 = nodes[0]
    before = {d.dir: members(cluster_of(d)) for d in nodes}

    # Forged: a record naming node 2, claiming a terabyte, with the right cluster id but a MAC
    # made without the key. Sent three times: refused each, logged once, node 2 unchanged.
    info2 = before[n1.dir][ids[1]]["info"]
    forged_node = NodeInfo(**{**info2, "memory_total": 2**40, "memory_usable": 2**40,
                              "models": (), "addresses": tuple(info2["addresses"])})
    forged = seal(Record(cluster_id(secret), forged_node, time.time(), new_nonce()),
                  b"not the key at all, but long enough")
    for _ in range(3):
        answer = send(h5, h1, hello_line(forged, 0))
        assert answer == {"refused": "bad MAC: forged, or altered on the way"}
    c = cluster_of(n1)
    assert members(c)[ids[1]]["info"] == info2
    bad = [n for n in foreign_at(c, h5.address) if n["node_id"] == ids[1]]
    assert bad and bad[0]["reason"].startswith("bad MAC") and bad[0]["refusals"] == 3
    assert refusals_logged(n1, "bad MAC") == 1

    # An insider's hello (the test holds the key), then the same hello again: a replay.
    tester = NodeInfo("tester", "tester", "cpu", GIB, GIB, 0)
    hello = seal(Record(cluster_id(secret), tester, time.time(), new_nonce()), secret)
    answer = send(h5, h1, hello_line(hello, 0))
    assert answer["answer"]["record"]["node"]["node_id"] == ids[0]
    heard = members(cluster_of(n1))["tester"]
    assert send(h5, h1, hello_line(hello, 0)) == {
        "refused": "replayed: its nonce was seen before"}
    # Node 1's answer, sent to node 2 as if it were node 1's hello: refused.
    assert send(h5, h2, hello_line(answer["answer"], 0)) == {
        "refused": "an answer to another hello, sent again (a replay)"}
    # A hello from longer ago than the clocks may differ: refused.
    old = seal(Record(cluster_id(secret), tester, time.time() - 2 * SKEW, new_nonce()), secret)
    refused = send(h5, h1, hello_line(old, 0))["refused"]
    assert "old" in refused and "replay" in refused
    c = cluster_of(n1)
    kinds = {n["reason"].split(":")[0].split(" (")[0] for n in foreign_at(c, h5.address)}
    assert {"bad MAC", "replayed"} <= kinds, kinds
    assert members(c)["tester"]["last_heard_s"] >= heard["last_heard_s"]
    # Nothing the attacker sent changed what any node knows of the three.
    for d in nodes:
        now = members(cluster_of(d))
        for node_id, row in before[d.dir].items():
            assert now[node_id]["info"] == row["info"], (node_id, d.dir)
    table = n1.ctl("cluster").stdout
    for reason in ("bad MAC", "replayed", "old"):
        assert reason in table, table


def test_seed_peers_without_multicast(daemons: Callable[..., Daemon], bridge: Bridge,
                                      tmp_path: Path) -> None:
    key = key_file(tmp_path / "cluster.key", "0123456789abcdef" * 4)
    h1, h2 = bridge.hosts[:2]
    a = daemons(node_config(h1, key, 4 * GIB, mdns=False, peers=[h2.address]), name=h1.name)
    b = daemons(node_config(h2, key, 8 * GIB, mdns=False), name=h2.name)
    a.start(prefix=tuple(h1.prefix()))
    b.start(prefix=tuple(h2.prefix()))
    ida = cluster_of(a)["announced"]["node_id"]
    idb = cluster_of(b)["announced"]["node_id"]
    # a asks its seed; b learns of a from a's hello, and asks it back from then on.
    ca = until(a, lambda c: idb in members(c), "a to see b")
    cb = until(b, lambda c: ida in members(c), "b to see a")
    assert members(ca)[idb]["info"]["memory_total"] == 8 * GIB
    assert members(cb)[ida]["address"] == h1.address
    assert not cb["mdns"] and not cb["peers"]

    # b's link cut: a lists it stale after peer_timeout, not foreign; back once it answers.
    bridge.hosts[1].link(False)
    c = until(a, lambda c: any(n["node_id"] == idb and n["state"] == "stale"
                               for n in c["nodes"]), "b to go stale")
    assert not foreign_at(c, h2.address)
    bridge.hosts[1].link(True)
    until(a, lambda c: idb in members(c), "b to be heard again")
    log = a.log_text()
    assert log.count("is stale: not heard for 5s") == 1 and "is heard again" in log
