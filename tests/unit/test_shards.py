"""Layer split between ranks."""

from __future__ import annotations

import itertools

import pytest

from exod.core.shards import Shard, ShardError, pipeline_shards, split_layers, tensor_shards


@pytest.mark.parametrize(("total", "world", "expected"), [
    (1, 1, [(0, 1)]),
    (8, 2, [(0, 4), (4, 8)]),
    (10, 3, [(0, 4), (4, 7), (7, 10)]),  # remainder to the first ranks
    (7, 4, [(0, 2), (2, 4), (4, 6), (6, 7)]),
    (11, 4, [(0, 3), (3, 6), (6, 9), (9, 11)]),
    (5, 5, [(i, i + 1) for i in range(5)]),
    (32, 1, [(0, 32)]),
])
def test_even_split(total: int, world: int, expected: list[tuple[int, int]]) -> None:
    assert split_layers(total, world) == expected


def test_even_split_invariants_over_a_range() -> None:
    for total in range(1, 41):
        for world in range(1, total + 1):
            parts = split_layers(total, world)
            assert len(parts) == world
            assert parts[0][0] == 0 and parts[-1][1] == total
            assert all(a[1] == b[0] for a, b in itertools.pairwise(parts))  # contiguous
            counts = [e - s for s, e in parts]
            assert min(counts) >= 1 and max(counts) - min(counts) <= 1
            assert counts == sorted(counts, reverse=True)  # the extra layers go first


@pytest.mark.parametrize(("total", "world"), [(3, 4), (1, 2), (0, 1), (-1, 1)])
def test_more_ranks_than_layers(total: int, world: int) -> None:
    with pytest.raises(ShardError, match="ranks but the model has only"):
        split_layers(total, world)


@pytest.mark.parametrize("world", [0, -1])
def test_needs_a_rank(world: int) -> None:
    with pytest.raises(ShardError, match="at least one rank"):
        split_layers(4, world)
    with pytest.raises(ShardError, match="at least one rank"):
        split_layers(4, world, ())


@pytest.mark.parametrize(("total", "explicit", "expected"), [
    (4, (3, 1), [(0, 3), (3, 4)]),
    (4, (1, 3), [(0, 1), (1, 4)]),
    (6, (1, 1, 4), [(0, 1), (1, 2), (2, 6)]),
    (2, (2,), [(0, 2)]),
])
def test_explicit_layers(total: int, explicit: tuple[int, ...],
                         expected: list[tuple[int, int]]) -> None:
    assert split_layers(total, len(explicit), explicit) == expected


@pytest.mark.parametrize(("total", "world", "explicit", "message"), [
    (4, 2, (4,), "layers: 1 entries for 2 ranks"),
    (4, 2, (1, 1, 2), "layers: 3 entries for 2 ranks"),
    (4, 2, (4, 0), "layers: every rank needs at least one layer"),
    (4, 2, (5, -1), "layers: every rank needs at least one layer"),
    (4, 2, (2, 1), "layers: sum 3 != the model's 4 layers"),
    (4, 2, (3, 2), "layers: sum 5 != the model's 4 layers"),
])
def test_explicit_layers_errors(total: int, world: int, explicit: tuple[int, ...],
                                message: str) -> None:
    with pytest.raises(ShardError) as e:
        split_layers(total, world, explicit)
    assert str(e.value) == message


def test_shard_error_is_a_value_error() -> None:
    assert issubclass(ShardError, ValueError)


def test_pipeline_shards() -> None:
    shards = pipeline_shards(10, 3)
    assert shards == [Shard(0, 3, 0, 4, 10), Shard(1, 3, 4, 7, 10), Shard(2, 3, 7, 10, 10)]
    assert [s.count for s in shards] == [4, 3, 3]
    assert [s.first for s in shards] == [True, False, False]
    assert [s.last for s in shards] == [False, False, True]
    assert [s.arg() for s in shards] == ["0:4", "4:7", "7:10"]
    assert pipeline_shards(4, 2, (3, 1))[1] == Shard(1, 2, 3, 4, 4)
    with pytest.raises(ShardError):
        pipeline_shards(4, 2, (3, 2))


def test_a_single_rank_is_first_and_last() -> None:
    (only,) = pipeline_shards(7, 1)
    assert only.first and only.last and only.count == 7 and only.arg() == "0:7"


def test_tensor_shards_hold_every_layer() -> None:
    shards = tensor_shards(12, 3)
    assert [(s.rank, s.world, s.start, s.end, s.total) for s in shards] == [
        (r, 3, 0, 12, 12) for r in range(3)]
    assert all(s.count == 12 for s in shards)
    assert [s.first for s in shards] == [True, False, False]
    assert [s.last for s in shards] == [False, False, True]
    assert tensor_shards(2, 4)[3].arg() == "0:2"  # more ranks than layers is fine here


def test_shard_is_frozen() -> None:
    with pytest.raises(AttributeError):
        Shard(0, 1, 0, 1, 1).start = 3  # type: ignore[misc]
