"""How a group's ports are chosen (exod.core.ports): outside the ephemeral range, never twice
while a group holds them, each checked free; and the daemon's side of it (the launcher's
registry, the ephemeral range read from the kernel)."""

from __future__ import annotations

import json
import random
import socket
from pathlib import Path

import pytest

from exod.config.schema import Instance
from exod.core import ports
from exod.daemon import rank_addresses
from exod.daemon.launch import Launcher

LINUX = (32768, 60999)


def test_outside_the_ephemeral_range() -> None:
    assert ports.outside(LINUX) == [range(20000, 32768), range(61000, 65536)]
    assert ports.outside((49152, 65535)) == [range(20000, 49152)]  # macOS
    assert ports.outside((1024, 65535)) == []
    assert ports.outside((10000, 25000)) == [range(25001, 65536)]


def test_a_range_covering_everything_falls_back_to_all_ports_and_says_so() -> None:
    assert ports.candidates(LINUX) == ([range(20000, 32768), range(61000, 65536)], True)
    assert ports.candidates((1024, 65535)) == ([range(ports.LOWEST, 65536)], False)


def test_choose_never_picks_reserved_ephemeral_or_taken_ports() -> None:
    spans = ports.outside(LINUX)
    busy = set(range(20000, 30000, 2))
    reserved = set(range(20001, 30000, 2))
    checked: list[int] = []

    def is_free(p: int) -> bool:
        checked.append(p)
        return p not in busy

    for seed in range(50):
        got = ports.choose(5, spans, reserved, is_free, random.Random(seed))
        assert len(set(got)) == 5
        assert all(any(p in s for s in spans) for p in got)
        assert not set(got) & (busy | reserved)
    assert not set(checked) & reserved  # reserved ports are not even tried
    assert all(not LINUX[0] <= p <= LINUX[1] for p in checked)


def test_choose_is_random_so_two_daemons_rarely_agree() -> None:
    spans = ports.outside(LINUX)
    a = ports.choose(3, spans, (), lambda p: True, random.Random(1))
    b = ports.choose(3, spans, (), lambda p: True, random.Random(2))
    assert a != b


def test_choose_gives_up_with_a_reason_when_nothing_is_free() -> None:
    with pytest.raises(ports.NoFreePorts, match=r"found 0 of the 3 free ports needed in "
                                                r"20000-20009 after 192 tries"):
        ports.choose(3, [range(20000, 20010)], (), lambda p: False, random.Random(0))
    # a tiny span, all of it reserved but two ports: the third is never found
    with pytest.raises(ports.NoFreePorts, match="found 2 of the 3"):
        ports.choose(3, [range(20000, 20010)], range(20002, 20010), lambda p: True,
                     random.Random(0))
    with pytest.raises(ports.NoFreePorts):
        ports.choose(1, [], (), lambda p: True, random.Random(0))


def test_registry_holds_until_released_and_keeps_configured_ranges() -> None:
    r = ports.Registry(configured=ports.configured_ports([(6100, 3), (7000, 1)]))
    assert r.reserved() == {6100, 6101, 6102, 7000}
    a, b = object(), object()
    r.hold(a, [21000, 21001])
    r.hold(b, [22000])
    assert r.reserved() == {6100, 6101, 6102, 7000, 21000, 21001, 22000}
    assert r.release(a) == (21000, 21001)
    assert r.release(a) == ()
    assert r.reserved() == {6100, 6101, 6102, 7000, 22000}


# ---- the daemon's side ---------------------------------------------------------------------
def test_the_kernel_range_is_read_and_bind_zero_ports_fall_inside_it() -> None:
    """The mechanism of the bug: a port from bind(0), what exod used to hand a rank, comes from
    the very range that outgoing connections take their source ports from."""
    first, last = rank_addresses.ephemeral_range()
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        assert (first, last) == tuple(int(x) for x in f.read().split())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        assert first <= s.getsockname()[1] <= last


def test_a_source_port_makes_the_rank_bind_fail_and_is_never_handed_out() -> None:
    """An outgoing connection holds its source port: a listener (as MLX's: SO_REUSEADDR and
    SO_REUSEPORT) cannot bind it, and exod's check sees it taken."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        with socket.create_connection(srv.getsockname()) as conn:
            source = conn.getsockname()[1]
            with socket.socket() as rank:
                rank.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                rank.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                with pytest.raises(OSError, match="in use"):
                    rank.bind(("127.0.0.1", source))
            assert not rank_addresses.is_free(source)


def test_a_reuseport_listener_counts_as_taken() -> None:
    """Another group's rank listening with SO_REUSEPORT would let a second one share its port
    (both groups then hang); the check must see it."""
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        with socket.socket() as second:  # the hazard itself
            second.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            second.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            second.bind(("127.0.0.1", port))
        assert not rank_addresses.is_free(port)


def test_free_ports_are_outside_the_ephemeral_range() -> None:
    first, last = rank_addresses.ephemeral_range()
    got = rank_addresses.free_ports(40, reserved=())
    assert len(set(got)) == 40
    assert all(p >= ports.LOWEST and not first <= p <= last for p in got)


def group(name: str, shards: int = 2, **kw: object) -> Instance:
    return Instance(name=name, model=Path("/m"), shards=shards, **kw)  # type: ignore[arg-type]


def hostfile_ports(launcher: Launcher, name: str) -> list[int]:
    ranks = json.loads(launcher.hostfile(name).read_text())
    return [int(r[0].rpartition(":")[2]) for r in ranks]


def test_launcher_never_gives_two_live_groups_a_port_and_a_restart_new_ports(
        tmp_path: Path) -> None:
    launcher = Launcher(tmp_path, {})
    launcher.configure([group("fixed", port_base=21000)])
    owners = [object() for _ in range(30)]
    held: set[int] = set()
    plans = []
    for k, owner in enumerate(owners):
        plan = launcher.prepare(group(f"g{k}", shards=3), owner)
        assert plan is not None
        plans.append(plan)
        mine = set(launcher.ports.held[owner])
        assert len(mine) == 4 and not mine & held
        assert mine == set(hostfile_ports(launcher, f"g{k}")) | {
            int(plan.control.rpartition(":")[2])}
        held |= mine
    assert not held & {21000, 21001, 21002}  # fixed's port_base range
    first = launcher.ports.held[owners[0]]
    launcher.release(owners[0])
    assert owners[0] not in launcher.ports.held
    launcher.prepare(group("g0", shards=3), owners[0], last=plans[0])  # the restart
    assert not set(launcher.ports.held[owners[0]]) & set(first)


def test_launcher_keeps_port_base_and_hosts(tmp_path: Path) -> None:
    """A group with port_base (required across hosts) keeps its configured ports and its hosts'
    addresses; nothing is reserved for it at run time."""
    from exod.config.schema import Host

    launcher = Launcher(tmp_path, {})
    inst = group("pair", port_base=6310,
                 hosts=(Host(name="a", address="10.0.0.1"), Host(name="b", address="fd00::2")))
    owner = object()
    plan = launcher.prepare(inst, owner)
    assert json.loads(launcher.hostfile("pair").read_text()) == [["10.0.0.1:6310"],
                                                                  ["[fd00::2]:6311"]]
    assert plan is not None and plan.control == "10.0.0.1:6312"
    assert owner not in launcher.ports.held


def test_macos_range_from_sysctl_and_a_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess
    import sys

    monkeypatch.setattr(sys, "platform", "darwin")

    def fake_run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        assert argv == ["sysctl", "-n", "net.inet.ip.portrange.first",
                        "net.inet.ip.portrange.last"]
        return subprocess.CompletedProcess(argv, 0, "49152\n65535\n", "")

    monkeypatch.setattr(subprocess, "run", fake_run)
    assert rank_addresses.ephemeral_range() == (49152, 65535)

    def broken(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        raise FileNotFoundError("sysctl")

    monkeypatch.setattr(subprocess, "run", broken)
    assert rank_addresses.ephemeral_range() == ports.FALLBACK_EPHEMERAL
    monkeypatch.setattr(sys, "platform", "sunos5")
    assert rank_addresses.ephemeral_range() == ports.FALLBACK_EPHEMERAL


# ---- the rank's side: its own port, checked before MLX binds it ------------------------------
def hostfile_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, address: str) -> None:
    path = tmp_path / "hostfile.json"
    path.write_text(json.dumps([[address], ["127.0.0.1:1"]]))
    monkeypatch.setenv("MLX_HOSTFILE", str(path))


@pytest.mark.parametrize("holder", ["listener", "reuseport-listener", "bound"])
def test_a_rank_finds_its_port_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    holder: str) -> None:
    from exod.runner.failures import AddressInUse
    from exod.runner.group.membership import check_own_port

    with socket.socket() as other:
        if holder == "reuseport-listener":  # what MLX would share, then hang
            other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        other.bind(("127.0.0.1", 0))
        if holder != "bound":
            other.listen()
        where = f"127.0.0.1:{other.getsockname()[1]}"
        hostfile_for(tmp_path, monkeypatch, where)
        with pytest.raises(AddressInUse, match=where):
            check_own_port(0)


def test_a_closed_connection_of_an_earlier_run_does_not_count(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The port of a group restarted with port_base: its old connections linger in TIME_WAIT,
    which MLX's bind (SO_REUSEADDR) passes, so the check must too."""
    from exod.runner.group.membership import check_own_port

    with socket.socket() as srv:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        conn, _ = srv.accept()
        conn.close()  # the accepted side closes first: it is the one left in TIME_WAIT
        client.close()
    hostfile_for(tmp_path, monkeypatch, f"127.0.0.1:{port}")
    check_own_port(0)
    hostfile_for(tmp_path, monkeypatch, "127.0.0.1:99999")  # MLX's to report
    check_own_port(0)
    monkeypatch.delenv("MLX_HOSTFILE")
    check_own_port(0)
