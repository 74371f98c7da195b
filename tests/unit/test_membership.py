"""The node table (exod.core.membership): states, what is worth a log line, links. The time is
given, as the daemon's monotonic clock would be."""

from __future__ import annotations

from exod.core.membership import MAX_REFUSALS, Membership, NodeState
from exod.core.nodes import Link, NodeInfo


def info(node_id: str, memory: int = 8) -> NodeInfo:
    return NodeInfo(node_id, f"host-{node_id}", "cpu", memory, memory, 0)


def test_a_member_goes_stale_and_comes_back() -> None:
    t = Membership("me", peer_timeout=10)
    assert t.heard(info("b"), (), sent=100.0, address="10.0.0.2", now=0) == "joined"
    assert t.heard(info("b"), (), sent=101.0, address="10.0.0.2", now=5) is None
    assert t.state("b", 14) is NodeState.MEMBER and [i.node_id for i in t.current(14)] == ["b"]
    assert t.tick(14) == []
    stale = t.tick(15.5)
    assert [m.info.node_id for m in stale] == ["b"] and t.tick(16) == []  # logged once
    assert t.state("b", 16) is NodeState.STALE and t.current(16) == []
    assert t.heard(info("b"), (), sent=200.0, address="10.0.0.2", now=30) == "back"
    assert t.state("b", 30) is NodeState.MEMBER


def test_an_older_record_changes_nothing() -> None:
    t = Membership("me", peer_timeout=10)
    t.heard(info("b", 8), (), sent=100.0, address="10.0.0.2", now=0)
    assert t.heard(info("b", 999), (), sent=99.0, address="10.6.6.6", now=3) is None
    m = t.members["b"]
    assert (m.info.memory_total, m.address, m.last_heard) == (8, "10.0.0.2", 0)


def test_this_node_is_never_its_own_member() -> None:
    t = Membership("me", peer_timeout=10)
    assert t.heard(info("me"), (), sent=1.0, address="127.0.0.1", now=0) is None
    assert t.members == {}


def test_refusals_one_row_and_one_line_per_address_and_kind() -> None:
    t = Membership("me", peer_timeout=10, forget_after=100)
    t.heard(info("b"), (), sent=1.0, address="10.0.0.2", now=0)
    assert t.refused("10.0.0.9", "bad-mac", "bad MAC", "b", now=1)  # claims b
    assert not t.refused("10.0.0.9", "bad-mac", "bad MAC", "b", now=2)  # no second line
    assert t.refused("10.0.0.9", "replayed", "replayed", "", now=3)
    assert t.refused("10.0.0.8", "bad-mac", "bad MAC", "", now=3)
    rows = t.rows(3)
    assert [(r.state, r.address) for r in rows] == [
        (NodeState.MEMBER, "10.0.0.2"), (NodeState.FOREIGN, "10.0.0.8"),
        (NodeState.FOREIGN, "10.0.0.9"), (NodeState.FOREIGN, "10.0.0.9")]
    assert rows[2].count == 2 and rows[2].node_id == "b"
    # A forged record naming b changed nothing of b.
    assert t.state("b", 3) is NodeState.MEMBER and t.members["b"].address == "10.0.0.2"
    assert t.state("nobody", 3) is None
    # Not repeated for forget_after: dropped (and a new one is worth a line again).
    t.tick(104)
    assert [r.state for r in t.rows(104)] == [NodeState.STALE]
    assert t.refused("10.0.0.9", "bad-mac", "bad MAC", "", now=105)


def test_refusals_are_bounded() -> None:
    t = Membership("me", peer_timeout=10)
    for i in range(MAX_REFUSALS + 5):
        t.refused(f"10.1.0.{i}", "unsigned", "unsigned", "", now=float(i))
    assert len(t.refusals) == MAX_REFUSALS
    assert ("10.1.0.0", "unsigned") not in t.refusals  # the oldest went first


def test_links_ours_and_those_members_measured() -> None:
    t = Membership("me", peer_timeout=10)
    t.heard(info("b"), (Link("b", "me", 0.02), Link("b", "c", 0.5), Link("b", "gone", 1.0)),
            sent=1.0, address="x", now=0)
    t.heard(info("c"), (), sent=1.0, address="y", now=0)
    t.measured("b", 0.01)
    t.measured("nobody", 0.01)
    assert t.links(1) == [Link("b", "c", 0.5), Link("b", "me", 0.02), Link("me", "b", 0.01)]
    assert t.own_links() == (Link("me", "b", 0.01),)
    # A stale member's links are not the cluster's any more.
    t.heard(info("c"), (), sent=2.0, address="y", now=11)
    assert t.links(11.5) == []
