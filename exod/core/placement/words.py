"""A refusal to place an instance, in one line with its numbers: what the whole model needs on one
rank, what each node has, and what the closest split would need of each node."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from exod.core.kinds import AUTO
from exod.core.nodes import NodeInfo
from exod.core.placement.costs import ModelCosts
from exod.core.placement.placed import Placement
from exod.core.sizes import format_size


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def layers(start: int, end: int) -> str:
    return f"layer {start}" if end - start == 1 else f"layers {start}-{end - 1}"


def refusal(instance: str, parallelism: str, shards: int, costs: Mapping[str, ModelCosts],
            nodes: Sequence[NodeInfo], closest: Placement | None) -> str:
    how = parallelism if shards == AUTO else f"{parallelism} over {shards} ranks"
    head = f"cannot place {instance} ({how})"
    if not nodes or not costs:
        return f"{head}: no node to place it on"
    total = next(iter(costs.values())).total
    if parallelism == "pipeline" and shards != AUTO and shards > total:
        return f"{head}: {shards} ranks but the model has only {total} layers"
    kinds = sorted({n.backend for n in nodes})
    whole = [costs[b].pipeline_rank(0, total, True, True, 1).describe()
             + (f" on a {b} node" if len(kinds) > 1 else "") for b in kinds]
    parts = [f"{head}: one rank holding the whole model needs {' or '.join(whole)}",
             "the nodes have " + ", ".join(
                 f"{n.name} {format_size(max(0, n.memory_usable))}"
                 + (f" ({n.backend})" if len(kinds) > 1 else "") for n in nodes)]
    heads = next(iter(costs.values())).heads
    if parallelism == "tensor":
        if len(kinds) > 1:
            parts.append("tensor ranks run only on nodes of one backend")
        if heads and shards != AUTO and heads % shards:
            parts.append(f"its {heads} attention heads do not split over {shards} ranks")
    if closest is not None:
        what = [(f"{layers(s.start, s.end)} " if parallelism == "pipeline" else "")
                + f"{format_size(s.need.total)} on {s.node.name} (has {format_size(s.room)})"
                for s in closest.seats]
        used = len(closest.nodes())
        parts.append(f"over {_count(used, 'node')} the {_count(closest.world, 'rank')} would "
                     "need " + ", ".join(what))
    return "; ".join(parts)
