"""Which loopback ports a group on this host listens on, when its instance has no `port_base`.

A port chosen by binding port 0 comes from the kernel's ephemeral range, the same pool that
outgoing connections take their source ports from. Between the moment the daemon picks a port
and the moment the rank binds it (seconds: the runner starts, imports mlx, joins the ring), an
outgoing connection or another group may take it. MLX's ring backend listens with SO_REUSEPORT,
so two ranks of different groups given the same port both bind it and the kernel splits the
connections between them: both groups then wait in accept() forever.

So ports are chosen here, at random, outside the ephemeral range, never one that another live
group of this daemon holds or that an instance's `port_base` range covers, and each checked
free by the caller's `is_free` (a bind). Pure: the ephemeral range, the check and the random
source are passed in.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field

LOWEST = 20000  # below: the registered ports of many services (databases, web servers, ...)
HIGHEST = 65535
# When the range cannot be read: Linux's default (32768-60999) and the IANA/BSD/macOS one
# (49152-65535) both inside.
FALLBACK_EPHEMERAL = (32768, 65535)
TRIES_PER_PORT = 64  # random candidates tried for each port before giving up


class NoFreePorts(Exception):
    pass


def outside(ephemeral: tuple[int, int], lowest: int = LOWEST,
            highest: int = HIGHEST) -> list[range]:
    """The ports in [lowest, highest] that are not in the ephemeral range (inclusive bounds,
    as the kernel states them)."""
    first, last = ephemeral
    spans = [range(lowest, min(first, highest + 1)), range(max(last + 1, lowest), highest + 1)]
    return [s for s in spans if len(s) > 0]


def candidates(ephemeral: tuple[int, int]) -> tuple[list[range], bool]:
    """Where to choose from, and whether that is safe from source ports. A kernel whose
    ephemeral range covers everything above LOWEST leaves nothing outside it: then the whole
    span (the old behaviour's risk, which the caller reports)."""
    spans = outside(ephemeral)
    if spans:
        return spans, True
    return [range(LOWEST, HIGHEST + 1)], False


def choose(n: int, spans: Sequence[range], reserved: Iterable[int],
           is_free: Callable[[int], bool], rng: random.Random) -> list[int]:
    """n distinct ports from `spans`, none in `reserved`, each passing `is_free`. Random, so
    that two daemons on one host rarely pick alike. NoFreePorts when too many tries fail."""
    taken = set(reserved)
    sizes = [len(s) for s in spans]
    total = sum(sizes)
    chosen: list[int] = []
    for _ in range(n * TRIES_PER_PORT):
        if len(chosen) == n:
            break
        k = rng.randrange(total) if total else 0
        port = _nth(spans, sizes, k) if total else None
        if port is None or port in taken:
            continue
        taken.add(port)  # checked once: free or not, it is not tried again
        if is_free(port):
            chosen.append(port)
    if len(chosen) < n:
        where = ", ".join(f"{s.start}-{s.stop - 1}" for s in spans) or "nothing"
        raise NoFreePorts(f"found {len(chosen)} of the {n} free ports needed in {where} "
                          f"after {n * TRIES_PER_PORT} tries")
    return chosen


def _nth(spans: Sequence[range], sizes: Sequence[int], k: int) -> int:
    for span, size in zip(spans, sizes, strict=True):
        if k < size:
            return span[k]
        k -= size
    raise IndexError(k)


@dataclass
class Registry:
    """Ports this daemon has handed out, by owner (a group's run), and ports that belong to
    instances by configuration (their `port_base` ranges), whether running or not."""

    configured: frozenset[int] = frozenset()
    held: dict[Hashable, tuple[int, ...]] = field(default_factory=dict)

    def reserved(self) -> set[int]:
        out = set(self.configured)
        for ports in self.held.values():
            out.update(ports)
        return out

    def hold(self, owner: Hashable, ports: Iterable[int]) -> None:
        self.held[owner] = tuple(ports)

    def release(self, owner: Hashable) -> tuple[int, ...]:
        return self.held.pop(owner, ())


def configured_ports(port_bases: Iterable[tuple[int, int]]) -> frozenset[int]:
    """Every port of (port_base, count) pairs."""
    return frozenset(p for base, count in port_bases for p in range(base, base + count))
