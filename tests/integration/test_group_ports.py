"""Groups on one host get their ports from the daemon (no `port_base`): several groups coming up
at once on one daemon never share a port nor take one from the ephemeral range, and a rank
whose port something else holds fails at once with the reason, and the group comes back on new
ports, instead of waiting in MLX's accept() forever. Real runners, the ring backend on
loopback."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from exod.daemon.rank_addresses import ephemeral_range
from tests.harness import Daemon
from tests.integration.test_sharding import all_ready, greedy


def group_ports(d: Daemon, name: str) -> list[int]:
    """The ports of a group's last start: the ranks' (its MLX hostfile) and rank 0's control
    port, which the daemon logs."""
    ranks = json.loads((d.socket.parent / "groups" / f"{name}.json").read_text())
    return [int(r[0].rpartition(":")[2]) for r in ranks]


def test_groups_starting_together_all_become_ready_on_distinct_ports(
        daemons: Callable[..., Daemon], tiny_model_factory: Callable[..., Path]) -> None:
    model = str(tiny_model_factory(layers=4))
    names = {"p1", "p2", "t1", "t2"}
    d = daemons({"instances": {
        name: {"model": model, "shards": 2,
               "parallelism": "tensor" if name.startswith("t") else "pipeline"}
        for name in sorted(names)}})
    d.start()
    snap = d.watch_until(all_ready(names), what="four groups ready")
    # each formed on its first try: no group lost its ports to another
    assert all(i["restarts"] == 0 for i in snap["instances"]), snap["instances"]
    ports = [p for name in sorted(names) for p in group_ports(d, name)]
    assert len(ports) == len(set(ports)) == 8
    first, last = ephemeral_range()
    assert all(not first <= p <= last for p in ports), (ports, first, last)
    assert all(greedy(d, name)[1] == 40 for name in sorted(names))


@pytest.mark.parametrize("rank", [0, 1])
def test_a_rank_whose_port_is_taken_fails_at_once_and_the_group_restarts_on_new_ports(
        daemons: Callable[..., Daemon], tiny_model_factory: Callable[..., Path],
        tmp_path: Path, rank: int) -> None:
    """The port is held the way another group's rank holds it (SO_REUSEPORT, which MLX's own
    bind would share instead of failing: two groups then wait for each other forever)."""
    mark = tmp_path / "squatted"
    d = daemons({"instances": {"g": {
        "model": str(tiny_model_factory(layers=4)), "shards": 2, "parallelism": "tensor",
        "backoff": {"initial": "100ms", "jitter": 0},
        "env": {"EXOD_DOUBLE": "squatted", "EXOD_DOUBLE_SQUAT_RANK": str(rank),
                "EXOD_DOUBLE_MARK": str(mark)}}}})
    d.start()
    inst = d.until_instance("g", lambda i: i["state"] == "ready", what="the group ready")
    assert mark.exists()  # the port was taken on the first start
    assert inst["restarts"] == 1
    exits = [e["extra"] for e in d.events(event="exit", instance="g", rank=rank)]
    assert exits[0]["code"] == 75, exits
    # Its peer, left waiting in mx.distributed's init (which keeps Python's lock), ends at the
    # ladder's SIGTERM: never a SIGKILL.
    ended = [e["extra"] for e in d.events(event="exit", instance="g")]
    assert all(e["signal"] != signal.SIGKILL for e in ended), ended
    lines = [e["message"] for e in d.events(instance="g", rank=rank)]
    taken = [line for line in lines if " is in use" in line]
    assert taken, lines
    port = int(taken[0].split("address 127.0.0.1:", 1)[1].split(" ", 1)[0])
    assert port not in group_ports(d, "g")  # the restart got other ports
    assert greedy(d, "g")[1] == 40


def test_status_names_the_taken_address(daemons: Callable[..., Daemon],
                                        tiny_model_factory: Callable[..., Path],
                                        tmp_path: Path) -> None:
    """Until the restart, `exoctl status` says why, in one line."""
    d = daemons({"instances": {"g": {
        "model": str(tiny_model_factory(layers=4)), "shards": 2,
        "backoff": {"initial": "1h", "jitter": 0},
        "env": {"EXOD_DOUBLE": "squatted", "EXOD_DOUBLE_SQUAT_RANK": "1",
                "EXOD_DOUBLE_MARK": str(tmp_path / "squatted")}}}})
    d.start()

    def says_why(i: dict[str, Any]) -> bool:
        return i["state"] == "backoff" and any(
            "is in use" in (r["error"] or "") for r in i["ranks"])

    d.until_instance("g", says_why, what="a backoff naming the address in use")
    out = d.ctl("status").stdout
    line = next(x for x in out.splitlines() if "in use" in x)
    assert "127.0.0.1:" in line and "another instance or program" in line, out
