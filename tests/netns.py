"""Two test "hosts" on one machine: network namespaces joined by a veth pair.

Addresses are assigned only to the veth ends created here, from a private /30 picked per test
run, and traffic goes only to them. Everything is removed on exit, even after a failure (and
a namespace left by a killed run is removed the next time, by its name prefix).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from types import TracebackType

PREFIX = "exodt"


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check,
                          timeout=30)


class NetnsUnavailable(RuntimeError):
    pass


@dataclass
class Host:
    name: str  # the exod node.name
    netns: str
    veth: str
    address: str

    def prefix(self) -> list[str]:
        """argv prefix that runs a command inside this host's namespace."""
        return ["ip", "netns", "exec", self.netns]

    def link(self, up: bool) -> None:
        ip("-n", self.netns, "link", "set", self.veth, "up" if up else "down")


class TwoHosts:
    def __init__(self) -> None:
        tag = str(os.getpid())  # interface names: at most 15 characters, this fits
        third = os.getpid() % 250 + 1  # 10.213.<third>.0/30: private, unlikely to be in use
        self.a = Host("host-a", f"{PREFIX}-a-{tag}", f"{PREFIX}a{tag}", f"10.213.{third}.1")
        self.b = Host("host-b", f"{PREFIX}-b-{tag}", f"{PREFIX}b{tag}", f"10.213.{third}.2")

    def __enter__(self) -> TwoHosts:
        remove_stale()
        try:
            for h in (self.a, self.b):
                ip("netns", "add", h.netns)
        except subprocess.CalledProcessError as e:
            self.close()
            raise NetnsUnavailable(f"cannot create network namespaces: {e.stderr.strip()}") from e
        try:
            ip("link", "add", self.a.veth, "netns", self.a.netns, "type", "veth",
               "peer", "name", self.b.veth, "netns", self.b.netns)
            for h in (self.a, self.b):
                ip("-n", h.netns, "addr", "add", f"{h.address}/30", "dev", h.veth)
                ip("-n", h.netns, "link", "set", "lo", "up")
                h.link(True)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        for h in (self.a, self.b):
            ip("netns", "del", h.netns, check=False)  # takes its veth end (and the pair) along


def remove_stale() -> None:
    """Namespaces of earlier runs that were killed before their cleanup."""
    res = ip("netns", "list", check=False)
    for line in res.stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        if name.startswith(f"{PREFIX}-"):
            pid = name.rsplit("-", 1)[-1]
            if not (pid.isdigit() and _alive(int(pid))):
                ip("netns", "del", name, check=False)


def _alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


class Bridge:
    """N test hosts on one Linux bridge, as machines on one LAN switch: each host a namespace
    with a veth whose other end is on the bridge, and the bridge in a namespace of its own
    (nothing is added to the machine's own network). Multicast crosses it, so mDNS works.
    Addresses 10.214.<third>.<i+1>/24."""

    def __init__(self, n: int) -> None:
        tag = self.tag = str(os.getpid())
        third = os.getpid() % 250 + 1
        self.netns = f"{PREFIX}-br-{tag}"
        self.bridge = f"{PREFIX}br{tag}"
        self.hosts = [Host(f"node-{i + 1}", f"{PREFIX}-n{i + 1}-{tag}", f"{PREFIX}{i + 1}{tag}",
                           f"10.214.{third}.{i + 1}") for i in range(n)]

    def __enter__(self) -> Bridge:
        remove_stale()
        try:
            for ns in [self.netns, *(h.netns for h in self.hosts)]:
                ip("netns", "add", ns)
        except subprocess.CalledProcessError as e:
            self.close()
            raise NetnsUnavailable(f"cannot create network namespaces: {e.stderr.strip()}") from e
        try:
            ip("-n", self.netns, "link", "add", self.bridge, "type", "bridge")
            ip("-n", self.netns, "link", "set", self.bridge, "up")
            for i, h in enumerate(self.hosts):
                port = f"{PREFIX}p{i + 1}{self.tag}"  # per run, as the hosts' ends
                ip("link", "add", h.veth, "netns", h.netns, "type", "veth",
                   "peer", "name", port, "netns", self.netns)
                ip("-n", self.netns, "link", "set", port, "master", self.bridge)
                ip("-n", self.netns, "link", "set", port, "up")
                ip("-n", h.netns, "addr", "add", f"{h.address}/24", "dev", h.veth)
                ip("-n", h.netns, "link", "set", "lo", "up")
                h.link(True)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        for ns in [*(h.netns for h in self.hosts), self.netns]:
            ip("netns", "del", ns, check=False)
