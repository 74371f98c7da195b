"""The one address rule of every fetch made for a client (exod.core.addresses): every IPv4-in-IPv6
form unwrapped and refused with the IPv4 address it carries named, every range that is not
global unicast refused by name, global addresses fetched (through a 6to4, Teredo or NAT64
wrapper too), the operator's allow-list winning where it names the address; and the picture
fetcher asking it of every URL and every resolved address. Pure: any connect or DNS look-up
fails the test."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from typing import Any

import pytest

from exod.api.image_fetch import CheckedResolver, Fetcher, Policy, Unfit
from exod.core.addresses import Network, address_problem, carried


@pytest.fixture(autouse=True)
def no_packet(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a check sent a packet")
    for name in ("connect", "connect_ex", "sendto"):
        monkeypatch.setattr(socket.socket, name, refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


def nets(*networks: str) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(n) for n in networks)


# ---- IPv4 in IPv6 clothes: (address, its form's block, the IPv4 carried, why) -----------------
FORMS = [
    # IPv4-mapped: the socket connects to the IPv4 address itself.
    ("::ffff:127.0.0.1", "::ffff:0:0/96", "127.0.0.1", "loopback"),
    ("::ffff:a9fe:a9fe", "::ffff:0:0/96", "169.254.169.254", "link-local"),
    ("::ffff:10.0.0.1", "::ffff:0:0/96", "10.0.0.1", "10.0.0.0/8"),
    # IPv4-compatible (deprecated): refused whatever it carries.
    ("::127.0.0.1", "::/96", "127.0.0.1", "loopback"),
    ("::192.168.1.1", "::/96", "192.168.1.1", "192.168.0.0/16"),
    ("::8.8.8.8", "::/96", "8.8.8.8", "deprecated"),
    # IPv4-translated (SIIT, obsolete): refused whatever it carries.
    ("::ffff:0:7f00:1", "::ffff:0:0:0/96", "127.0.0.1", "loopback"),
    ("::ffff:0:808:808", "::ffff:0:0:0/96", "8.8.8.8", "obsolete"),
    # 6to4: the relay delivers to the IPv4 address in bits 16-47.
    ("2002:7f00:1::", "2002::/16", "127.0.0.1", "loopback"),
    ("2002:a9fe:a9fe::1", "2002::/16", "169.254.169.254", "link-local"),
    ("2002:c0a8:101:1::1", "2002::/16", "192.168.1.1", "192.168.0.0/16"),
    # Teredo: server 65.54.227.120 (global), client obfuscated (bits inverted): 127.0.0.1, then
    # 10.0.0.1 as the server with a global client (8.8.8.8).
    ("2001:0:4136:e378:8000:63bf:80ff:fffe", "2001::/32", "client 127.0.0.1", "loopback"),
    ("2001:0:a00:1::f7f7:f7f7", "2001::/32", "server 10.0.0.1", "10.0.0.0/8"),
    # NAT64, the well-known prefix: the translator delivers to the IPv4 address in the last 32 bits.
    ("64:ff9b::a9fe:a9fe", "64:ff9b::/96", "169.254.169.254", "cloud metadata"),
    ("64:ff9b::127.0.0.1", "64:ff9b::/96", "127.0.0.1", "loopback"),
    ("64:ff9b::c612:1", "64:ff9b::/96", "198.18.0.1", "benchmarking"),
    # NAT64, the local-use prefix (not globally reachable): refused whatever it carries.
    ("64:ff9b:1::a9fe:a9fe", "64:ff9b:1::/48", "169.254.169.254", "link-local"),
    ("64:ff9b:1::808:808", "64:ff9b:1::/48", "8.8.8.8", "RFC 8215"),
]


@pytest.mark.parametrize("address, block, inside, why", FORMS)
def test_every_ipv4_in_ipv6_form_is_refused_naming_what_it_carries(
        address: str, block: str, inside: str, why: str) -> None:
    refused = address_problem(address)
    assert refused is not None and f"({block}) of {inside}" in refused and why in refused, \
        refused


def test_each_form_is_recognised_and_its_ipv4_read() -> None:
    for address, block, inside, _ in FORMS:
        found = carried(ipaddress.IPv6Address(address))
        assert found is not None and found.form.prefix == block, address
        assert inside.split()[-1] in [str(v4) for _, v4 in found.addresses], address
    for plain in ("::", "::1", "2606:4700::1111", "fe80::1", "64:ff9b:2::1"):
        assert carried(ipaddress.IPv6Address(plain)) is None, plain


# ---- every range that is not global unicast: (address, the range its refusal names) -----------
@pytest.mark.parametrize("address, named", [
    ("127.0.0.1", "loopback address (127.0.0.0/8)"), ("127.255.255.254", "loopback"),
    ("::1", "loopback address (::1/128)"),
    ("10.1.2.3", "10.0.0.0/8"), ("172.16.0.1", "172.16.0.0/12"),
    ("172.31.255.255", "172.16.0.0/12"), ("192.168.1.1", "192.168.0.0/16"),
    ("169.254.169.254", "link-local address (169.254.0.0/16"),
    ("fe80::1", "link-local address (fe80::/10)"), ("fe80::1%eth0", "link-local"),
    ("fec0::1", "fec0::/10, site-local"), ("feff::1", "site-local"),
    ("fd00::1", "fc00::/7, unique-local"), ("fc00::1", "unique-local"),
    ("224.0.0.1", "multicast address"), ("239.255.255.250", "multicast"),
    ("ff02::1", "multicast address (ff00::/8)"),
    ("0.0.0.0", "unspecified"), ("::", "unspecified"), ("0.1.2.3", "0.0.0.0/8, this network"),
    ("100.64.0.1", "100.64.0.0/10, shared"), ("100.127.255.255", "shared"),
    ("192.0.2.1", "documentation"), ("198.51.100.1", "documentation"),
    ("203.0.113.1", "documentation"), ("2001:db8::1", "documentation"),
    ("3fff::1", "3fff::/20, documentation"),
    ("198.18.0.1", "benchmarking"), ("198.19.255.255", "benchmarking"),
    ("2001:2::1", "2001:2::/48, benchmarking"),
    ("192.0.0.8", "IETF protocol assignments"), ("2001:10::1", "IETF protocol assignments"),
    ("192.88.99.1", "6to4 relay anycast"), ("240.0.0.1", "240.0.0.0/4, reserved"),
    ("255.255.255.255", "broadcast"), ("100::1", "discard-only"), ("5f00::1", "SRv6"),
    ("64:ff9b:2::1", "outside 2000::/3"), ("4000::1", "outside 2000::/3"),
    ("not-an-address", "not an IP address"), ("", "not an IP address"),
])
def test_what_is_not_global_unicast_is_refused_by_name(address: str, named: str) -> None:
    refused = address_problem(address)
    assert refused is not None and named in refused, refused


# ---- global addresses, fetched --------------------------------------------------------------
@pytest.mark.parametrize("address", [
    "8.8.8.8", "1.1.1.1", "93.184.215.14", "2606:4700::1111", "2a00:1450:4001:82a::200e",
    # The edges of refused ranges, just outside them.
    "100.63.255.255", "100.128.0.0", "172.15.255.255", "172.32.0.0", "198.17.255.255",
    "198.20.0.0", "223.255.255.255", "11.0.0.0", "2000::1", "3fff:1000::1",
    # IPv4-mapped: the socket connects to 8.8.8.8 itself.
    "::ffff:8.8.8.8",
    # A relay or translator delivers to the global IPv4 address carried, one a client could
    # name directly: nothing is reached that 8.8.8.8 would not reach, so allowing it is right.
    "64:ff9b::808:808", "2002:808:808::1",
    "2001:0:4136:e378:8000:63bf:f7f7:f7f7",  # Teredo: server 65.54.227.120, client 8.8.8.8
])
def test_global_addresses_may_be_fetched(address: str) -> None:
    assert address_problem(address) is None


def test_an_address_object_is_judged_as_its_text() -> None:
    assert address_problem(ipaddress.ip_address("64:ff9b::a9fe:a9fe")) == \
        address_problem("64:ff9b::a9fe:a9fe")
    assert address_problem(ipaddress.IPv6Address("fe80::1%eth0")) == address_problem("fe80::1")


# ---- the operator's allow-list ---------------------------------------------------------------
def test_the_allow_list_wins_where_it_names_the_address() -> None:
    lan = nets("10.1.2.0/24")
    assert address_problem("10.1.2.3", lan) is None
    assert address_problem("10.1.3.3", lan) is not None
    assert address_problem("::ffff:10.1.2.3", lan) is None  # the same socket destination
    # Carried through a relay or translator, 10.1.2.3 is in the relay's network, not the LAN.
    for disguised in ("64:ff9b::a01:203", "2002:a01:203::1", "::10.1.2.3", "::ffff:0:a01:203",
                      "64:ff9b:1::a01:203"):
        refused = address_problem(disguised, lan)
        assert refused is not None and "10.1.2.3" in refused, disguised
    # Named as IPv6, the operator's networks win over any rule.
    assert address_problem("64:ff9b::a01:203", nets("64:ff9b::a01:203/128")) is None
    assert address_problem("64:ff9b:1::808:808", nets("64:ff9b:1::/48")) is None
    assert address_problem("fec0::1", nets("fec0::/10")) is None
    assert address_problem("127.0.0.2", nets("127.0.0.2/32")) is None
    assert address_problem("127.0.0.1", nets("127.0.0.2/32")) is not None
    assert address_problem("::1", nets("127.0.0.0/8")) is not None  # families do not mix


# ---- the picture fetcher asks the rule, before any connection --------------------------------
@pytest.mark.parametrize("host, inside", [
    ("[::127.0.0.1]", "127.0.0.1"), ("[::ffff:0:7f00:1]", "127.0.0.1"),
    ("[64:ff9b::a9fe:a9fe]", "169.254.169.254"), ("[64:ff9b:1::a9fe:a9fe]", "169.254.169.254"),
    ("[2002:7f00:1::]:8080", "127.0.0.1"), ("[2001:0:4136:e378:8000:63bf:80ff:fffe]", "127.0.0.1"),
    ("[::ffff:127.0.0.1]", "127.0.0.1"), ("[fec0::1]", "fec0::/10"),
])
def test_the_fetcher_refuses_each_form_in_a_url(host: str, inside: str) -> None:
    with pytest.raises(Unfit, match="names .*" + inside.replace(".", r"\.")):
        Fetcher(Policy())._check(f"http://{host}/latest/meta-data")


class Answers:
    """The resolver CheckedResolver asks: answers what it is told, sends nothing."""

    def __init__(self, *addresses: str) -> None:
        self.addresses = addresses

    async def resolve(self, host: str, port: int = 0, family: Any = 0) -> list[Any]:
        return [{"hostname": host, "host": a, "port": port, "family": family, "proto": 0,
                 "flags": 0} for a in self.addresses]

    async def close(self) -> None:
        pass


@pytest.mark.parametrize("answer, inside", [
    ("64:ff9b::a9fe:a9fe", "169.254.169.254"), ("::127.0.0.1", "127.0.0.1"),
    ("::ffff:0:7f00:1", "127.0.0.1"), ("fec0::1", "fec0::/10"),
])
def test_a_name_that_resolves_to_a_disguise_is_refused(answer: str, inside: str) -> None:
    async def run() -> None:
        resolver = CheckedResolver(())
        resolver._inner = Answers("93.184.215.14", answer)  # type: ignore[assignment]
        with pytest.raises(Unfit, match="resolves to .*" + inside.replace(".", r"\.")):
            await resolver.resolve("pictures.example", 443)
    asyncio.run(run())
