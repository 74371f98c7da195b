"""A placement: each rank's node, its layers, what it needs and the room it has there."""

from __future__ import annotations

from dataclasses import dataclass

from exod.core.memory import Estimate
from exod.core.nodes import NodeInfo
from exod.core.shards import Parallelism, Shard


class PlacementRefused(ValueError):
    """Nothing holds the instance; the message (one line) says what it needs and what each
    node has."""


@dataclass(frozen=True)
class Seat:
    """One rank's place: its node, its layers, what it needs and the room it has there."""

    rank: int
    node: NodeInfo
    start: int
    end: int
    need: Estimate
    room: int  # the node's memory_usable, shared evenly among the ranks it runs


@dataclass(frozen=True)
class Placement:
    instance: str
    parallelism: Parallelism
    total: int  # the model's layers
    seats: tuple[Seat, ...]

    @property
    def world(self) -> int:
        return len(self.seats)

    def shards(self) -> list[Shard]:
        return [Shard(s.rank, self.world, s.start, s.end, self.total) for s in self.seats]

    def counts(self) -> tuple[int, ...]:
        """Each rank's number of layers (a pipeline's `layers:`)."""
        return tuple(s.end - s.start for s in self.seats)

    def nodes(self) -> list[NodeInfo]:
        """The nodes used, in rank order, each once."""
        return list({s.node.node_id: s.node for s in self.seats}.values())
