"""Any node serves, the pure parts: where a request for another node's instance goes
(exod.core.upstream) and which headers cross the hop (exod.api.proxy.headers)."""

from __future__ import annotations

from exod.api.proxy.headers import HOP, back, onward
from exod.core.nodes import NodeInfo
from exod.core.upstream import Upstream, announced, choose, elsewhere


def node(name: str, addresses: tuple[str, ...] = (), api_port: int = 0) -> NodeInfo:
    return NodeInfo(f"id-{name}", name, "cpu", 1, 1, 1, addresses=addresses, api_port=api_port)


def test_without_a_member_of_that_name_the_hosts_address_and_this_nodes_port() -> None:
    got = choose("mac-a", "10.0.0.1", [node("mac-b", ("10.0.0.2",), 9000)], 52415)
    assert got == Upstream("mac-a", "10.0.0.1", 52415)
    assert got.origin == "http://10.0.0.1:52415"


def test_a_member_of_that_name_gives_its_announced_api_port() -> None:
    members = [node("mac-b", ("10.0.0.2",), 9000), node("mac-a", ("10.0.0.9",), 9001)]
    assert choose("mac-a", "10.0.0.1", members, 52415) == Upstream("mac-a", "10.0.0.1", 9001)


def test_a_hosts_entry_by_name_is_replaced_by_the_members_address() -> None:
    members = [node("mac-a", ("10.0.0.9", "192.168.1.4"), 9001)]
    assert choose("mac-a", "mac-a.local", members, 52415).host == "10.0.0.9"
    # No announced address: the name as written.
    assert choose("mac-a", "mac-a.local", [node("mac-a", (), 9001)], 1).host == "mac-a.local"


def test_a_member_announcing_no_api_is_not_taken_for_its_port() -> None:
    assert choose("mac-a", "10.0.0.1", [node("mac-a", ("10.0.0.1",), 0)], 7).port == 7


def test_ipv6_origin_is_bracketed() -> None:
    assert Upstream("n", "fd00::1", 80).origin == "http://[fd00::1]:80"


def test_hop_by_hop_headers_are_dropped_and_the_key_passes_unchanged() -> None:
    sent = [("Host", "10.0.0.2:52415"), ("Connection", "keep-alive, X-Secret-Hop"),
            ("Keep-Alive", "timeout=5"), ("X-Secret-Hop", "1"), ("TE", "trailers"),
            ("Transfer-Encoding", "chunked"), ("Content-Length", "12"),
            ("Proxy-Authorization", "Basic abc"), ("Upgrade", "h2c"),
            ("Authorization", "Bearer sk-test"), ("x-api-key", "sk-other"),
            ("Content-Type", "application/json"), ("Accept", "text/event-stream")]
    assert onward(sent, "mac-b") == [
        ("Authorization", "Bearer sk-test"), ("x-api-key", "sk-other"),
        ("Content-Type", "application/json"), ("Accept", "text/event-stream"),
        (HOP, "mac-b")]


def test_a_hop_mark_sent_by_the_client_is_replaced_by_this_nodes() -> None:
    assert onward([(HOP.lower(), "forged")], "mac-b") == [(HOP, "mac-b")]


def test_answer_headers_keep_their_own_but_not_framing_or_the_peers_identity() -> None:
    got = back([("Content-Type", "text/event-stream"), ("Content-Length", "10"),
                ("Transfer-Encoding", "chunked"), ("Date", "x"), ("Server", "Python"),
                ("Connection", "close"), ("Retry-After", "5"), ("Cache-Control", "no-cache"),
                ("X-Exod-Ignored", "logprobs")])
    assert got == [("Content-Type", "text/event-stream"), ("Retry-After", "5"),
                   ("Cache-Control", "no-cache"), ("X-Exod-Ignored", "logprobs")]


def serving(name: str, serves: tuple[str, ...], port: int = 9000,
            addresses: tuple[str, ...] = ("10.0.0.5",)) -> NodeInfo:
    return NodeInfo(f"id-{name}", name, "cpu", 1, 1, 1, addresses=addresses, api_port=port,
                    serves=serves)


def test_an_instance_no_config_here_names_goes_to_the_member_that_announces_it() -> None:
    members = [serving("me", ("big",)), serving("z-node", ("big",), 9002, ("10.0.0.9",)),
               serving("m-node", ("big", "small"), 9001, ("10.0.0.7", "10.0.1.7"))]
    assert announced("big", members, "id-me") == Upstream("m-node", "10.0.0.7", 9001)
    assert announced("small", members, "id-me") == Upstream("m-node", "10.0.0.7", 9001)
    assert announced("none", members, "id-me") is None
    # Never this node itself, nor a member with no API or no address to reach it at.
    assert announced("big", [serving("me", ("big",))], "id-me") is None
    assert announced("big", [serving("n", ("big",), port=0)], "id-me") is None
    assert announced("big", [serving("n", ("big",), addresses=())], "id-me") is None


def test_the_cluster_s_other_instances_are_those_this_config_does_not_name() -> None:
    members = [serving("me", ("local",)), serving("b", ("big", "local")), serving("a", ("big",)),
               serving("c", ("tiny",), port=0)]
    assert elsewhere(members, "id-me", ["local"]) == {"big": "a"}
