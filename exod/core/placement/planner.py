"""Where an instance's ranks run: the fewest nodes that hold it, in the order of their links.

From what each node announces (`NodeInfo.memory_usable`, `backend`), the links between them and
what the model costs a rank (`ModelCosts`, per backend), the planner tries one node, then two,
and so on (the MAX_NODES with the most memory), and keeps, among the sets of that size that
hold the instance, the one whose chain is fastest (then the most memory, then the node ids).
A node that runs several ranks (a number of `shards` above the nodes used) shares its memory
evenly among them, and runs them one after another in the chain. Pipeline ranks hold layer
ranges sized by their room (exod.core.placement.split); tensor ranks run only on nodes of one
backend, in a number that divides the attention heads. Deterministic: the same nodes and links
give every daemon the same placement. Nothing fits: `PlacementRefused`, with the numbers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import combinations

from exod.core.kinds import AUTO
from exod.core.nodes import Link, NodeInfo
from exod.core.placement.chain import Links, cost, link_table, orders
from exod.core.placement.costs import ModelCosts
from exod.core.placement.split import RankRoom, balanced, can_fit, spans
from exod.core.placement.placed import Placement, PlacementRefused, Seat
from exod.core.placement.words import refusal
from exod.core.shards import Parallelism

MAX_NODES = 12  # the nodes weighed, those with the most memory: 4,095 sets at most
ORDERS_TRIED = 24  # orders of one set tried, fastest first, before the set is given up


def place(instance: str, parallelism: Parallelism, shards: int, costs: Mapping[str, ModelCosts],
          nodes: Iterable[NodeInfo], links: Iterable[Link] = ()) -> Placement:
    """`shards`: the number of ranks, or AUTO (one per node used). `costs`: for each backend
    among the nodes. Raises PlacementRefused."""
    weighed = sorted(nodes, key=lambda n: (-n.memory_usable, n.node_id))[:MAX_NODES]
    by_id = sorted(weighed, key=lambda n: n.node_id)
    table = link_table(links)
    total = next(iter(costs.values())).total if costs else 0
    most = len(by_id) if shards == AUTO else min(shards, len(by_id))
    if parallelism == "pipeline" and shards != AUTO and shards > total:
        most = 0  # fewer layers than ranks: refused below
    for k in range(1, most + 1):
        floor = _least_need(parallelism, k if shards == AUTO else shards, costs)
        found = [p for group in combinations(by_id, k)
                 if sum(n.memory_usable for n in group) >= floor
                 and (p := _seated(instance, parallelism, shards, costs, group, table))]
        if found:
            return min(found, key=lambda p: _score(p, table))
    raise PlacementRefused(refusal(instance, parallelism, shards, costs, weighed,
                                   _closest(instance, parallelism, shards, costs, weighed, table)))


def _least_need(parallelism: Parallelism, world: int, costs: Mapping[str, ModelCosts]) -> int:
    """Less than any `world` ranks need together, whatever their nodes: a set of nodes with
    less memory in all is not weighed further."""
    def need(c: ModelCosts) -> int:
        if parallelism == "tensor":
            return world * c.tensor_rank(False, world).total
        ranks = [c.pipeline_rank(0, 0, r == 0, r == world - 1, world).total for r in range(world)]
        return sum(ranks) + sum(c.layers) + c.kv_layer * c.total

    return min(need(c) for c in costs.values())


def _score(p: Placement, table: Links) -> tuple[float, int, tuple[str, ...]]:
    ids = tuple(n.node_id for n in p.nodes())
    return cost(ids, table), -sum(n.memory_usable for n in p.nodes()), ids


def ranks_per_node(world: int, group: Sequence[NodeInfo]) -> dict[str, int]:
    """`world` ranks over the nodes of `group`, one each, then each further rank to the node
    with the most memory per rank it would run (the D'Hondt rule; ties: the node id)."""
    count = {n.node_id: 1 for n in group}
    for _ in range(world - len(group)):
        ordered = sorted(group, key=lambda n: n.node_id)
        pick = ordered[0]
        for n in ordered[1:]:
            if n.memory_usable * (count[pick.node_id] + 1) > \
                    pick.memory_usable * (count[n.node_id] + 1):
                pick = n
        count[pick.node_id] += 1
    return count


def _seated(instance: str, parallelism: Parallelism, shards: int,
            costs: Mapping[str, ModelCosts], group: Sequence[NodeInfo], table: Links,
            strict: bool = True) -> Placement | None:
    """The best placement on exactly the nodes of `group`, or None when they cannot hold it
    (`strict=False`: the balanced split whether or not it fits, for a refusal)."""
    world = len(group) if shards == AUTO else shards
    if parallelism == "tensor":
        heads = next(iter(costs.values())).heads
        if len({n.backend for n in group}) > 1 or (heads and heads % world):
            return None
    count = ranks_per_node(world, group)
    nodes = {n.node_id: n for n in group}
    for order in orders(list(nodes), table)[:ORDERS_TRIED]:
        seq = [nodes[i] for i in order for _ in range(count[i])]
        seats = (_tensor(seq, count, costs, strict) if parallelism == "tensor"
                 else _pipeline(seq, count, costs, strict))
        if seats is not None:
            total = next(iter(costs.values())).total
            return Placement(instance, parallelism, total, seats)
    return None


def _rooms(seq: Sequence[NodeInfo], count: Mapping[str, int]) -> list[int]:
    return [max(0, n.memory_usable) // count[n.node_id] for n in seq]


def _pipeline(seq: Sequence[NodeInfo], count: Mapping[str, int],
              costs: Mapping[str, ModelCosts], strict: bool) -> tuple[Seat, ...] | None:
    world, rooms = len(seq), _rooms(seq, count)
    ranks = []
    for r, n in enumerate(seq):
        c = costs[n.backend]
        fixed = c.pipeline_rank(0, 0, r == 0, r == world - 1, world).total
        ranks.append(RankRoom(rooms[r], fixed, tuple(w + c.kv_layer for w in c.layers)))
    if strict and not can_fit(ranks):
        return None
    counts = balanced(ranks, strict)
    if counts is None:
        return None
    return tuple(Seat(r, n, s, e, costs[n.backend].pipeline_rank(s, e, r == 0, r == world - 1,
                                                                 world), rooms[r])
                 for r, (n, (s, e)) in enumerate(zip(seq, spans(counts), strict=True)))


def _tensor(seq: Sequence[NodeInfo], count: Mapping[str, int],
            costs: Mapping[str, ModelCosts], strict: bool) -> tuple[Seat, ...] | None:
    world, rooms = len(seq), _rooms(seq, count)
    seats = tuple(Seat(r, n, 0, costs[n.backend].total,
                       costs[n.backend].tensor_rank(r == 0, world), rooms[r])
                  for r, n in enumerate(seq))
    if strict and any(s.need.total > s.room for s in seats):
        return None
    return seats


def _closest(instance: str, parallelism: Parallelism, shards: int,
             costs: Mapping[str, ModelCosts], weighed: Sequence[NodeInfo],
             table: Links) -> Placement | None:
    """What the most nodes would need of each (for a refusal), where such a split exists."""
    group = sorted(weighed, key=lambda n: n.node_id)
    if shards != AUTO:
        group = sorted(weighed[:shards], key=lambda n: n.node_id)
    if parallelism == "tensor":
        kinds = sorted({n.backend for n in group})
        group = max(([n for n in group if n.backend == b] for b in kinds),
                    key=lambda g: (len(g), sum(n.memory_usable for n in g)), default=[])
        heads = next(iter(costs.values())).heads
        if shards == AUTO and heads:  # the most ranks that split the heads evenly
            most = max(w for w in range(1, len(group) + 1) if heads % w == 0) if group else 0
            group = sorted(sorted(group, key=lambda n: (-n.memory_usable, n.node_id))[:most],
                           key=lambda n: n.node_id)
    if not group:
        return None
    return _seated(instance, parallelism, shards, costs, group, table, strict=False)
