"""Multi-host for real: two network namespaces joined by a veth pair, one exod in each, one
2-rank pipeline instance across them. Then the link is cut: both hosts detect and report the
failure; when the link returns the group forms again and is ready on both."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from collections.abc import Callable

import pytest

from tests.harness import Daemon
from tests.netns import NetnsUnavailable, TwoHosts

PEER_TIMEOUT = "2s"


def instance(model: Path, hosts: TwoHosts, key: Path) -> dict[str, Any]:
    return {"model": str(model), "shards": 2, "port_base": 6310, "peer_timeout": PEER_TIMEOUT,
            "cluster_key_file": str(key),
            "backoff": {"initial": "200ms", "max": "1s"},
            "start_limit": {"burst": 50},
            "hosts": [{"name": hosts.a.name, "address": hosts.a.address},
                      {"name": hosts.b.name, "address": hosts.b.address}]}


def ranks(d: Daemon) -> list[dict[str, Any]]:
    return d.instance("pp")["ranks"]


def test_two_hosts_form_lose_and_regain_a_group(daemons: Callable[..., Daemon],
                                                tiny_model: Path, tmp_path: Path) -> None:
    key = tmp_path / "cluster.key"
    key.write_text("0123456789abcdef" * 4)
    key.chmod(0o600)
    try:
        hosts = TwoHosts().__enter__()
    except NetnsUnavailable as e:
        pytest.fail(str(e))  # CI runs as root: this must work there
    try:
        a = daemons({"node": {"name": hosts.a.name}, "api": {"listen": ""},
                     "instances": {"pp": instance(tiny_model, hosts, key)}}, name="host-a")
        b = daemons({"node": {"name": hosts.b.name}, "api": {"listen": ""},
                     "instances": {"pp": instance(tiny_model, hosts, key)}}, name="host-b")
        a.start(prefix=tuple(hosts.a.prefix()))
        b.start(prefix=tuple(hosts.b.prefix()))

        # Each daemon runs only its own rank and sees the other as remote; ready on both.
        for d, mine in ((a, 0), (b, 1)):
            inst = d.until_state("pp", "ready")
            local = [r for r in inst["ranks"] if not r["remote"]]
            remote = [r for r in inst["ranks"] if r["remote"]]
            assert [r["rank"] for r in local] == [mine] and local[0]["pid"]
            assert [r["rank"] for r in remote] == [1 - mine]
            assert remote[0]["pid"] is None and remote[0]["state"] == "ready"
            assert remote[0]["host"] == (hosts.b.name if mine == 0 else hosts.a.name)
            assert local[0]["layers_loaded"] == local[0]["layers_total"] == 2
        first = {d.dir: ranks(d)[i]["pid"] for d, i in ((a, 0), (b, 1))}

        # Cut the link: no process dies and no socket closes, only silence. Both detect it.
        hosts.a.link(False)
        for d in (a, b):
            lost = d.until_instance(
                "pp", lambda i: i["restarts"] >= 1 and i["state"] != "ready",
                what="the lost peer to be detected")
            assert lost["state"] in ("backoff", "starting", "loading")
            exits = [e["extra"] for e in d.events(event="exit", instance="pp")]
            assert any(x["code"] == 76 for x in exits), exits  # EXIT_PEER_LOST
            assert not any(x["signals_sent"] for x in exits)

        # While the link is down the group cannot form: nobody is ready, nothing is failed.
        for d in (a, b):
            inst = d.instance("pp")
            assert inst["state"] not in ("ready", "failed"), inst

        hosts.a.link(True)
        for d, i in ((a, 0), (b, 1)):
            inst = d.until_state("pp", "ready")
            assert inst["ranks"][i]["pid"] not in (None, first[d.dir])

        assert a.terminate() == 0 and b.terminate() == 0
        for d in (a, b):
            steps = {e["extra"]["step"] for e in d.events(event="ladder")}
            assert "SIGKILL" not in steps, steps
    finally:
        for d in (locals().get("a"), locals().get("b")):
            if d is not None:
                d.close()
        hosts.close()
