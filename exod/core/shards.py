"""Which layers each rank owns. Pure: used by config validation, the daemon and the runner."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Parallelism = Literal["pipeline", "tensor"]  # by layers, or each layer across the ranks


@dataclass(frozen=True)
class Shard:
    rank: int
    world: int
    start: int  # first layer owned (inclusive)
    end: int  # one past the last layer owned
    total: int  # layers in the whole model

    @property
    def count(self) -> int:
        return self.end - self.start

    @property
    def first(self) -> bool:
        return self.rank == 0

    @property
    def last(self) -> bool:
        return self.rank == self.world - 1

    def arg(self) -> str:
        """Command-line form, `start:end`."""
        return f"{self.start}:{self.end}"


class ShardError(ValueError):
    pass


def split_layers(
    total: int, world: int, explicit: tuple[int, ...] | None = None
) -> list[tuple[int, int]]:
    """[start, end) per rank: `explicit` counts, or an even split with the remainder going to
    the first ranks. Every rank gets at least one layer."""
    if world < 1:
        raise ShardError("need at least one rank")
    if explicit is not None:
        if len(explicit) != world:
            raise ShardError(f"layers: {len(explicit)} entries for {world} ranks")
        if any(n < 1 for n in explicit):
            raise ShardError("layers: every rank needs at least one layer")
        if sum(explicit) != total:
            raise ShardError(f"layers: sum {sum(explicit)} != the model's {total} layers")
        counts = list(explicit)
    else:
        if world > total:
            raise ShardError(f"{world} ranks but the model has only {total} layers")
        q, r = divmod(total, world)
        counts = [q + (1 if i < r else 0) for i in range(world)]
    out, start = [], 0
    for n in counts:
        out.append((start, start + n))
        start += n
    return out


def pipeline_shards(total: int, world: int, explicit: tuple[int, ...] | None = None) -> list[Shard]:
    spans = split_layers(total, world, explicit)
    return [Shard(i, world, s, e, total) for i, (s, e) in enumerate(spans)]


def tensor_shards(total: int, world: int) -> list[Shard]:
    """Tensor parallel: every rank holds every layer (a slice of each)."""
    return [Shard(i, world, 0, total, total) for i in range(world)]
