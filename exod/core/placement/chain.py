"""The order of a pipeline's nodes: a chain through the fastest links.

Each token's hidden state crosses every link of the chain once, so a chain costs the sum of its
links' seconds per MiB. A link measured both ways counts at its slower direction; a pair with no
measured link counts as slower than any measured one (UNKNOWN_LINK). Up to EXHAUSTIVE nodes
every order is weighed; beyond, the chains that start at each node and go on to the nearest
node not yet in it. Ties go to the order whose node ids come first, so every daemon orders the
same nodes alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
import itertools
from itertools import permutations

from exod.core.nodes import Link

UNKNOWN_LINK = 1000.0  # seconds per MiB: a KiB a second, slower than any link measured
EXHAUSTIVE = 6  # nodes up to which every order is weighed (720 orders)

Links = dict[frozenset[str], float]


def link_table(links: Iterable[Link]) -> Links:
    """Seconds per MiB between two nodes, at the slower direction where both are measured."""
    table: Links = {}
    for link in links:
        if link.a == link.b:
            continue
        pair = frozenset((link.a, link.b))
        table[pair] = max(table.get(pair, 0.0), link.seconds_per_mib)
    return table


def cost(order: Sequence[str], table: Links) -> float:
    return sum(table.get(frozenset(pair), UNKNOWN_LINK)
               for pair in itertools.pairwise(order) if pair[0] != pair[1])


def orders(ids: Sequence[str], table: Links) -> list[tuple[str, ...]]:
    """The orders of the nodes `ids`, the fastest chain first."""
    if len(ids) <= EXHAUSTIVE:
        found = set(permutations(ids))
    else:
        found = {_nearest_first(start, ids, table) for start in ids}
    return sorted(found, key=lambda o: (cost(o, table), o))


def _nearest_first(start: str, ids: Sequence[str], table: Links) -> tuple[str, ...]:
    chain = [start]
    left = sorted(set(ids) - {start})
    while left:
        nxt = min(left, key=lambda n: (table.get(frozenset((chain[-1], n)), UNKNOWN_LINK), n))
        chain.append(nxt)
        left.remove(nxt)
    return tuple(chain)
