"""Where the ranks of a multi-rank instance run and listen, as mx.distributed needs to know.

Rank r runs on `hosts[r]` (every rank on this host when `hosts` is not given) and listens on
`port_base + r`. Without `port_base` (possible only when every rank is on this host) free
ports are chosen each time the group starts. The ring backend reads the list from a JSON
hostfile (MLX_HOSTFILE), which each daemon writes for its own ranks: hosts share nothing but
the instance's definition.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from exod.config.schema import Instance

LOOPBACK = "127.0.0.1"


def host_of(inst: Instance, rank: int, this_host: str) -> str:
    return inst.hosts[rank].name if inst.hosts else this_host


def addresses(inst: Instance) -> list[str]:
    """`address:port` for every rank, in rank order."""
    hosts = [h.address for h in inst.hosts] if inst.hosts else [LOOPBACK] * inst.shards
    ports = ([inst.port_base + r for r in range(inst.shards)] if inst.port_base is not None
             else free_ports(inst.shards))
    # config checks refuse a `hosts` list whose length is not `shards`
    return [f"{_bracket(a)}:{p}" for a, p in zip(hosts, ports, strict=True)]


def free_ports(n: int) -> list[int]:
    """n currently free loopback ports (held open together, so they are distinct)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((LOOPBACK, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def write_hostfile(path: Path, addrs: list[str]) -> None:
    path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps([[a] for a in addrs]))
    os.replace(tmp, path)


def _bracket(address: str) -> str:
    return f"[{address}]" if ":" in address and not address.startswith("[") else address
