"""Which addresses exod may connect to for a client: the one rule for every fetch a request can
aim (SSRF). The picture fetcher (exod.api.image_fetch) checks with it every address a URL names,
every address its name resolves to and every redirect's, before connecting; the audio fetcher
must use it too, and so must any later fetch made for a client. Pure: no socket, no resolver.

Only global unicast is fetched. An IPv4 address in IPv6 clothes is unwrapped first, and the
IPv4 it carries named in the refusal: IPv4-mapped is judged as that IPv4 address itself (the
socket connects to it); 6to4, Teredo and NAT64's well-known prefix are refused when what they
carry is not global, since a relay delivers to it; the deprecated and local-use forms are
refused whatever they carry. Then named ranges, anything outside IPv6's global unicast space
(2000::/3), and anything `ipaddress` does not call global. The operator's allow-list
(`api.image_url_allow`) wins where one of its networks holds the address as written, or an
IPv4-mapped one's IPv4: a tunnel's or translator's IPv4 is reached in the relay's network, not
the operator's, so only its IPv6 form allows it. Every prefix and range: docs/vision.md,
"Pictures by URL".
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address, IPv4Network, IPv6Network

Address = IPv4Address | IPv6Address
Network = IPv4Network | IPv6Network

LOOPBACK, LINK_LOCAL, MULTICAST = "loopback", "link-local", "multicast"
OTHER = "private or reserved"


def _ranges(*rows: tuple[str, str, str]) -> tuple[tuple[Network, str, str], ...]:
    return tuple((ipaddress.ip_network(net), kind, name) for net, kind, name in rows)


# (network, kind, name): the first that holds an address names its refusal.
IPV4_RANGES = _ranges(
    ("0.0.0.0/32", OTHER, "unspecified"),
    ("0.0.0.0/8", OTHER, "this network"),
    ("10.0.0.0/8", OTHER, "private"),
    ("100.64.0.0/10", OTHER, "shared address space"),
    ("127.0.0.0/8", LOOPBACK, ""),
    ("169.254.0.0/16", LINK_LOCAL, "cloud metadata among them"),
    ("172.16.0.0/12", OTHER, "private"),
    # IANA calls 192.0.0.9 and .10 (anycast) global; no picture is served there.
    ("192.0.0.0/24", OTHER, "IETF protocol assignments"),
    ("192.0.2.0/24", OTHER, "documentation"),
    ("192.88.99.0/24", OTHER, "6to4 relay anycast, deprecated"),
    ("192.168.0.0/16", OTHER, "private"),
    ("198.18.0.0/15", OTHER, "benchmarking"),
    ("198.51.100.0/24", OTHER, "documentation"),
    ("203.0.113.0/24", OTHER, "documentation"),
    ("224.0.0.0/4", MULTICAST, ""),
    ("255.255.255.255/32", OTHER, "broadcast"),
    ("240.0.0.0/4", OTHER, "reserved"),
)
IPV6_RANGES = _ranges(
    ("::/128", OTHER, "unspecified"),
    ("::1/128", LOOPBACK, ""),
    ("100::/64", OTHER, "discard-only"),
    ("2001:2::/48", OTHER, "benchmarking"),
    ("2001:db8::/32", OTHER, "documentation"),
    # The rest of IETF's protocol block (a few anycast services that IANA calls global): no
    # picture is served there either.
    ("2001::/23", OTHER, "IETF protocol assignments"),
    ("3fff::/20", OTHER, "documentation"),
    ("5f00::/16", OTHER, "segment routing (SRv6) identifiers"),
    ("fc00::/7", OTHER, "unique-local"),
    ("fe80::/10", LINK_LOCAL, ""),
    ("fec0::/10", OTHER, "site-local, deprecated"),
    ("ff00::/8", MULTICAST, ""),
)
GLOBAL_UNICAST = IPv6Network("2000::/3")


@dataclass(frozen=True)
class Form:
    """An IPv4-in-IPv6 form."""

    prefix: str  # the block, as the refusal names it
    name: str
    judged: bool  # True: as good as what it carries; False: refused whatever it carries
    why: str = ""  # why a form that is not judged is refused


MAPPED = Form("::ffff:0:0/96", "IPv4-mapped", True)
COMPATIBLE = Form("::/96", "IPv4-compatible", False, "deprecated (RFC 4291), not global unicast")
TRANSLATED = Form("::ffff:0:0:0/96", "IPv4-translated", False, "obsolete, not global unicast")
NAT64 = Form("64:ff9b::/96", "NAT64", True)
NAT64_LOCAL = Form("64:ff9b:1::/48", "local-use NAT64", False,
                   "a local translator's, not globally reachable (RFC 8215)")
SIXTOFOUR = Form("2002::/16", "6to4", True)
TEREDO = Form("2001::/32", "Teredo", True)

_NAT64 = int(IPv6Address("64:ff9b::")) >> 32
_NAT64_LOCAL = int(IPv6Address("64:ff9b:1::")) >> 80


@dataclass(frozen=True)
class Carried:
    """The IPv4 addresses an IPv6 address carries, by role ("" for the one of most forms;
    Teredo's "server" and "client")."""

    form: Form
    addresses: tuple[tuple[str, IPv4Address], ...]


def carried(ip: IPv6Address) -> Carried | None:
    """What `ip` carries, when it is an IPv4-in-IPv6 form."""
    value = int(ip)
    upper, low = value >> 32, IPv4Address(value & 0xFFFFFFFF)
    if upper == 0xFFFF:
        return Carried(MAPPED, (("", low),))
    if upper == 0xFFFF0000:
        return Carried(TRANSLATED, (("", low),))
    if upper == 0 and value > 1:  # :: and ::1 are themselves
        return Carried(COMPATIBLE, (("", low),))
    if upper == _NAT64:
        return Carried(NAT64, (("", low),))
    if value >> 80 == _NAT64_LOCAL:
        return Carried(NAT64_LOCAL, (("", low),))
    if ip.sixtofour is not None:
        return Carried(SIXTOFOUR, (("", ip.sixtofour),))
    if ip.teredo is not None:
        server, client = ip.teredo
        return Carried(TEREDO, (("server", server), ("client", client)))
    return None


def _in(ip: Address, allow: Iterable[Network]) -> bool:
    return any(ip in net for net in allow)  # False across families


def _range_problem(ip: Address) -> str | None:
    """Why `ip` itself (unwrapped) is not global unicast, or None."""
    for net, kind, name in IPV4_RANGES if ip.version == 4 else IPV6_RANGES:
        if ip in net:
            return f"a {kind} address ({net}{', ' if name else ''}{name})"
    if isinstance(ip, IPv6Address) and ip not in GLOBAL_UNICAST:
        return f"a {OTHER} address (outside {GLOBAL_UNICAST}, the global unicast space)"
    if not ip.is_global:
        return f"a {OTHER} address"
    return None


def address_problem(address: str | Address, allow: Iterable[Network] = ()) -> str | None:
    """Why exod must not connect to `address` for a client ("ADDRESS, a loopback address
    (127.0.0.0/8)"), or None. `allow`: the networks the operator trusts."""
    try:
        ip: Address = ipaddress.ip_address(address.split("%", 1)[0]) \
            if isinstance(address, str) else address
    except ValueError:
        return f"{address!r}, which is not an IP address"
    if isinstance(ip, IPv6Address) and ip.scope_id is not None:
        ip = IPv6Address(int(ip))  # a zone does not change where the address is
    allow = tuple(allow)
    if _in(ip, allow):
        return None
    inside = carried(ip) if isinstance(ip, IPv6Address) else None
    if inside is None:
        why = _range_problem(ip)
        return None if why is None else f"{ip}, {why}"
    form = inside.form
    for role, v4 in inside.addresses:
        if form is MAPPED and _in(v4, allow):
            return None
        whose = f"{role} " if role else ""
        why = _range_problem(v4)
        if why is not None:
            return f"{ip}, the {form.name} form ({form.prefix}) of {whose}{v4}, {why}"
    if not form.judged:
        v4s = " and ".join(str(v4) for _, v4 in inside.addresses)
        return f"{ip}, the {form.name} form ({form.prefix}) of {v4s}: {form.why}"
    return None
