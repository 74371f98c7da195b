"""Where the ranks of a multi-rank instance run and listen, as mx.distributed needs to know.

Rank r runs on `hosts[r]` (every rank on this host when `hosts` is not given) and listens on
`port_base + r`; rank 0 also listens on `port_base + N` for the group's control connections
(`exod.wire.specs.GroupSpec.control`). Without `port_base` (possible only when every rank is on this
host) free ports are chosen each time the group starts, outside the kernel's ephemeral range
(exod.core.ports says why). The ring backend reads the ranks' list from a JSON hostfile
(MLX_HOSTFILE, which each runner sets from its spec), which each daemon writes for its own
ranks: hosts share nothing but the instance's definition.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import socket
import subprocess
import sys
import tempfile
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from loguru import logger

from exod import trust
from exod.config.schema import Instance
from exod.core import ports as port_choice

LOOPBACK = "127.0.0.1"


def host_of(inst: Instance, rank: int, this_host: str) -> str:
    return inst.hosts[rank].name if inst.hosts else this_host


@dataclass(frozen=True)
class Addresses:
    ranks: list[str]  # `address:port` of every rank, in rank order (the MLX hostfile)
    control: str  # `address:port` where rank 0 takes the control connections


def addresses(inst: Instance, chosen: list[int] | None = None) -> Addresses:
    """`chosen`: the group's ports (one per rank, then the control port) when the instance has
    no `port_base`."""
    n = inst.shards
    hosts = [h.address for h in inst.hosts] if inst.hosts else [LOOPBACK] * n
    if inst.port_base is not None:
        ports = [inst.port_base + r for r in range(n + 1)]
    elif chosen is not None and len(chosen) == n + 1:
        ports = chosen
    else:
        raise ValueError(f"{inst.name}: {n + 1} ports needed, got {chosen}")
    # config checks refuse a `hosts` list whose length is not `shards`
    ranks = [f"{_bracket(a)}:{p}" for a, p in zip(hosts, ports[:n], strict=True)]
    return Addresses(ranks, f"{_bracket(hosts[0])}:{ports[n]}")


def thread_split(inst: Instance, local_ranks: int, env: Mapping[str, str]) -> int | None:
    """BLAS threads per rank when several ranks of a group share this host: the cores divided
    among them (the runner sets OPENBLAS_NUM_THREADS from its spec). Each rank's BLAS would
    otherwise start a thread per core, and ranks that wait for each other on oversubscribed
    cores ran several times slower (`python -m bench sharding`). An operator's own setting
    (daemon or instance env) wins: None."""
    if local_ranks < 2 or "OPENBLAS_NUM_THREADS" in inst.env or "OPENBLAS_NUM_THREADS" in env:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // local_ranks)


def free_ports(n: int, reserved: Collection[int],
               rng: random.Random | None = None) -> list[int]:
    """n loopback ports for a group's listeners: outside the ephemeral range, none of
    `reserved`, each free when checked. NoFreePorts when they cannot be found."""
    spans, safe = port_choice.candidates(ephemeral_range())
    if not safe:
        logger.warning("the kernel's ephemeral port range covers {}-{}: a group's ports may be "
                       "taken by outgoing connections (narrow the range, or set port_base)",
                       port_choice.LOWEST, port_choice.HIGHEST)
    return port_choice.choose(n, spans, reserved, is_free, rng or random.SystemRandom())


def is_free(port: int) -> bool:
    """Nothing is bound to this port now, on any IPv4 address (hence the wildcard). Without
    SO_REUSEADDR, so that a listener sharing its port (SO_REUSEPORT, as MLX's), a connection's
    source port or one lingering in TIME_WAIT count as taken too."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' source ports (inclusive)."""
    try:
        if sys.platform.startswith("linux"):
            with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
                first, last = (int(x) for x in f.read().split())
        elif sys.platform == "darwin":
            out = subprocess.run(
                ["sysctl", "-n", "net.inet.ip.portrange.first", "net.inet.ip.portrange.last"],
                capture_output=True, text=True, timeout=5, check=True).stdout
            first, last = (int(x) for x in out.split())
        else:
            return port_choice.FALLBACK_EPHEMERAL
    except (OSError, ValueError, subprocess.SubprocessError):
        return port_choice.FALLBACK_EPHEMERAL
    if not 1 <= first <= last <= port_choice.HIGHEST:
        return port_choice.FALLBACK_EPHEMERAL
    return first, last


def write_private(path: Path, data: bytes) -> None:
    """Write `path` (0600) in a private folder (0700, ours): under an unpredictable temporary
    name created with O_EXCL, then renamed into place, so no other user can plant a symlink
    or read it on the way."""
    trust.ensure_private_dir(path.parent, group_access=False)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_hostfile(path: Path, addrs: list[str]) -> None:
    write_private(path, json.dumps([[a] for a in addrs]).encode())


def new_group_key(path: Path) -> None:
    """A fresh secret for a group whose ranks all run on this host (each start makes one)."""
    write_private(path, secrets.token_hex(32).encode())


def _bracket(address: str) -> str:
    return f"[{address}]" if ":" in address and not address.startswith("[") else address
