"""The planner: the fewest nodes that hold an instance, layers sized by each node's room, ranks
in the order of the links, tensor ranks on one backend, a refusal with the numbers, and the same
placement from the same membership whatever order it is given in."""

from __future__ import annotations

import itertools
import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exod.core.kinds import AUTO
from exod.core.memory import GROUP_RANK_BYTES, RUNTIME_BYTES, TensorInfo, estimate
from exod.core.nodes import Link, NodeInfo
from exod.core.placement import ModelCosts, PlacementRefused, model_costs, place
from exod.core.placement.chain import UNKNOWN_LINK, link_table, orders
from exod.core.placement.planner import ranks_per_node
from exod.core.placement.split import RankRoom, balanced, can_fit, fits, spans
from exod.core.shards import Shard, pipeline_shards, tensor_shards
from exod.core.sizes import format_size

MiB = 2**20
# 12 layers of 100 MiB, a 10 MiB KV reserve each, 50 MiB embeddings and head: 1,805 MiB on one
# rank with its runtime (384 MiB). A rank of several needs 531 MiB (the runtime and a group's
# share: 480 MiB; its end of the model, 50; 1 every rank holds) and 110 MiB a layer.
COSTS = ModelCosts(layers=(100 * MiB,) * 12, kv_layer=10 * MiB, embed=50 * MiB, head=50 * MiB,
                   every=MiB, heads=16)
WHOLE = COSTS.pipeline_rank(0, 12, True, True, 1).total


def node(node_id: str, mib: int, backend: str = "cpu") -> NodeInfo:
    return NodeInfo(node_id=node_id, name=f"host-{node_id}", backend=backend,
                    memory_total=mib * MiB + GROUP_RANK_BYTES, memory_usable=mib * MiB,
                    disk_free=0)


def seats(nodes: list[NodeInfo], shards: int = AUTO, parallelism: str = "pipeline",
          links: tuple[Link, ...] = ()) -> list[tuple[str, int, int]]:
    p = place("big", parallelism, shards, {"cpu": COSTS, "metal": COSTS}, nodes,  # type: ignore[arg-type]
              links)
    for s in p.seats:
        assert s.need.total <= s.room  # every rank fits where it is
    return [(s.node.node_id, s.start, s.end) for s in p.seats]


def test_fits_on_one_node() -> None:
    assert WHOLE == 1805 * MiB
    assert seats([node("a", 2000)]) == [("a", 0, 12)]


def test_needs_two_nodes_each_holding_a_contiguous_range() -> None:
    got = seats([node("a", 1200), node("b", 1200)])
    assert [g[0] for g in got] == ["a", "b"]
    assert got[0][1] == 0 and got[0][2] == got[1][1] and got[1][2] == 12


def test_uneven_nodes_hold_uneven_layers_in_proportion_to_their_room() -> None:
    # Neither holds it alone; b has twice a's room, and holds about twice its bytes.
    p = place("big", "pipeline", AUTO, {"cpu": COSTS}, [node("a", 900), node("b", 1800)])
    by_node = {s.node.node_id: s for s in p.seats}
    assert by_node["b"].end - by_node["b"].start > by_node["a"].end - by_node["a"].start + 3
    share = by_node["b"].need.total / (by_node["a"].need.total + by_node["b"].need.total)
    assert share == pytest.approx(2 / 3, abs=0.06)


def test_the_fewest_nodes_that_hold_it() -> None:
    assert sorted(g[0] for g in seats([node("a", 800), node("b", 1100), node("c", 1400)])) \
        == ["b", "c"]  # a with either would not hold it; b and c do
    assert seats([node("a", 2500), node("b", 2500), node("c", 2500)]) == [("a", 0, 12)]
    # Of the nodes that each hold it, the one with the most memory.
    assert seats([node("a", 2000), node("b", 3000)]) == [("b", 0, 12)]


def test_a_number_of_shards_on_one_node_splits_by_bytes_not_by_count() -> None:
    heavy_ends = ModelCosts(layers=(100 * MiB,) * 12, kv_layer=0, embed=400 * MiB, head=0)
    p = place("big", "pipeline", 2, {"cpu": heavy_ends}, [node("a", 10_000)])
    assert p.counts() == (8, 4) or p.counts()[0] < p.counts()[1]  # rank 0 holds the embeddings
    assert p.counts()[0] < 6 and sum(p.counts()) == 12
    assert {s.node.node_id for s in p.seats} == {"a"}
    assert [s.room for s in p.seats] == [5_000 * MiB] * 2  # the node's memory, shared


def test_more_ranks_than_nodes_go_to_the_node_with_the_most_room_per_rank() -> None:
    assert ranks_per_node(3, [node("a", 2000), node("b", 1000)]) == {"a": 2, "b": 1}
    assert ranks_per_node(4, [node("b", 1000), node("a", 1000)]) == {"a": 2, "b": 2}
    assert ranks_per_node(3, [node("b", 1000), node("a", 1000)]) == {"a": 2, "b": 1}
    got = seats([node("a", 2000), node("b", 1000)], shards=3)
    assert [g[0] for g in got] in (["a", "a", "b"], ["b", "a", "a"])  # a's ranks side by side


def test_pipeline_ranks_follow_the_fastest_links() -> None:
    nodes = [node(i, 1000) for i in "abc"]  # two would hold 8 layers: three are needed
    links = (Link("a", "b", 0.5), Link("a", "c", 0.01), Link("c", "b", 0.02))
    assert [g[0] for g in seats(nodes, links=links)] == ["a", "c", "b"]
    # Measured both ways: the slower direction counts.
    links = (Link("a", "c", 0.01), Link("c", "a", 0.9), Link("c", "b", 0.02), Link("a", "b", 0.05))
    assert [g[0] for g in seats(nodes, links=links)] == ["a", "b", "c"]


def test_a_pair_with_no_measured_link_comes_after_every_measured_one() -> None:
    table = link_table([Link("a", "b", 5.0)])
    best = orders(["a", "b", "c"], table)[0]
    assert best in (("c", "a", "b"), ("b", "a", "c"), ("a", "b", "c"), ("c", "b", "a"))
    assert UNKNOWN_LINK > 5.0


def test_of_equal_sets_the_fastest_chain_then_the_most_memory() -> None:
    nodes = [node("a", 1200), node("b", 1200), node("c", 1300)]
    # b and c hold it; a and c hold it; a-c is the fast link.
    links = (Link("a", "c", 0.01), Link("b", "c", 0.2), Link("a", "b", 0.2))
    assert sorted(g[0] for g in seats(nodes, links=links)) == ["a", "c"]
    # No link measured: the two nodes with the most memory (c, then a by its id).
    assert sorted(g[0] for g in seats(nodes)) == ["a", "c"]


def test_tensor_ranks_only_on_nodes_of_one_backend() -> None:
    mixed = [node("a", 1300), node("b", 1300, "metal")]
    with pytest.raises(PlacementRefused, match="tensor ranks run only on nodes of one backend"):
        seats(mixed, parallelism="tensor")
    # The same nodes take a pipeline.
    assert [g[0] for g in seats(mixed)] == ["a", "b"]
    # With two nodes of one backend among them, those two.
    got = seats([*mixed, node("c", 1300, "metal")], parallelism="tensor")
    assert got == [("b", 0, 12), ("c", 0, 12)]


def test_tensor_ranks_split_the_heads_evenly() -> None:
    # 16 heads: never 3 ranks; with 3 nodes that each hold a quarter, 4 ranks do not fit
    # (3 nodes), so 2 must hold it.
    three = [node(i, 1500) for i in "abc"]
    got = seats(three, parallelism="tensor")
    assert len(got) == 2 and all((s, e) == (0, 12) for _, s, e in got)
    with pytest.raises(PlacementRefused, match="16 attention heads do not split over 3 ranks"):
        seats(three, shards=3, parallelism="tensor")


def test_the_refusal_names_what_is_needed_and_what_each_node_has() -> None:
    nodes = [node("a", 800), node("b", 700)]
    with pytest.raises(PlacementRefused) as e:
        seats(nodes)
    text = str(e.value)
    assert "\n" not in text and text.startswith("cannot place big (pipeline): ")
    assert f"one rank holding the whole model needs {format_size(WHOLE)}" in text
    assert "the nodes have host-a 800MiB, host-b 700MiB" in text
    # The closest split over both: each range, its need and the node's room.
    found = re.findall(r"layers (\d+)-(\d+) ([\d.]+\w+) on host-(\w) \(has (\w+)\)", text)
    assert [(f[3], f[4]) for f in found] == [("a", "800MiB"), ("b", "700MiB")]
    assert found[0][0] == "0" and found[-1][1] == "11"


def test_more_ranks_than_layers_is_refused_with_the_numbers() -> None:
    with pytest.raises(PlacementRefused, match="13 ranks but the model has only 12 layers"):
        seats([node("a", 99_000)], shards=13)


@pytest.mark.parametrize("parallelism", ["pipeline", "tensor"])
def test_every_daemon_computes_the_same_placement(parallelism: str) -> None:
    nodes = [node(f"n{i}", 1000 + 37 * (i % 3)) for i in range(6)]
    links = [Link(a.node_id, b.node_id, 0.01 * ((i * 7 + j * 3) % 5 + 1))
             for i, a in enumerate(nodes) for j, b in enumerate(nodes) if i < j]
    first = seats(nodes, parallelism=parallelism, links=tuple(links))
    rng = random.Random(7)
    for _ in range(5):
        rng.shuffle(nodes)
        rng.shuffle(links)
        assert seats(nodes, parallelism=parallelism, links=tuple(links)) == first
    # Equal nodes: the one with the lowest id.
    assert seats([node("b", 3000), node("a", 3000)]) == [("a", 0, 12)]


# ---- the split -----------------------------------------------------------------------------
def _objective(ranks: list[RankRoom], counts: tuple[int, ...]) -> float:
    return sum(r.need(s, e) ** 2 / r.room for r, (s, e) in zip(ranks, spans(counts), strict=True))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=8),
       st.lists(st.tuples(st.integers(1, 40), st.integers(0, 6)), min_size=1, max_size=4))
def test_the_split_is_the_best_balanced_one_that_fits(layers: list[int],
                                                      rooms: list[tuple[int, int]]) -> None:
    ranks = [RankRoom(room, fixed, tuple(layers)) for room, fixed in rooms]
    k, n = len(ranks), len(layers)
    every = [c for c in itertools.product(range(1, n + 1), repeat=k) if sum(c) == n]
    fitting = [c for c in every if fits(ranks, c)]
    got = balanced(ranks)
    assert can_fit(ranks) == (got is not None) == bool(fitting)
    if got is not None:
        assert fits(ranks, got)
        assert _objective(ranks, got) == pytest.approx(min(_objective(ranks, c) for c in fitting))


def test_the_split_balances_need_by_room() -> None:
    ranks = [RankRoom(100, 0, (1,) * 30), RankRoom(200, 0, (1,) * 30)]
    assert balanced(ranks) == (10, 20)
    # Equal rooms, equal needs: the first rank's 40 fixed bytes leave it one layer.
    assert balanced([RankRoom(100, 40, (1,) * 30), RankRoom(100, 0, (1,) * 30)]) == (1, 29)
    assert balanced([RankRoom(100, 10, (1,) * 30), RankRoom(100, 0, (1,) * 30)]) == (10, 20)
    assert not can_fit([RankRoom(10, 0, (1,) * 30), RankRoom(10, 0, (1,) * 30)])
    # Where no split fits, `strict=False` still gives the balanced one (for a refusal).
    assert balanced([RankRoom(10, 0, (1,) * 30), RankRoom(20, 0, (1,) * 30)], strict=False) \
        == (10, 20)


# ---- what a rank costs: the same as memory admission counts ------------------------------------
def _tensors() -> list[TensorInfo]:
    out = [TensorInfo("model.embed_tokens.weight", "BF16", 4096), TensorInfo("model.norm.weight",
                                                                          "BF16", 64),
           TensorInfo("lm_head.weight", "BF16", 4096)]
    for i in range(6):
        out += [TensorInfo(f"model.layers.{i}.mlp.weight", "BF16", 1000 + 10 * i),
                TensorInfo(f"model.layers.{i}.mlp.qweight", "U32", 500)]
    return out


CONFIG: dict[str, object] = {"num_hidden_layers": 6, "num_attention_heads": 8,
                             "num_key_value_heads": 2, "hidden_size": 256,
                             "max_position_embeddings": 4096}


@pytest.mark.parametrize("on_cpu", [True, False])
@pytest.mark.parametrize("tied", [True, False])
def test_a_rank_costs_what_memory_admission_counts(on_cpu: bool, tied: bool) -> None:
    config = {**CONFIG, "tie_word_embeddings": tied}
    tensors = [t for t in _tensors() if not (tied and t.name.startswith("lm_head"))]
    costs = model_costs(tensors, config, "auto", on_cpu, 3, 1000)
    assert costs.total == 6 and costs.heads == 8
    for world in (1, 2, 3):
        for s in pipeline_shards(6, world, (1, 2, 3)[:world] if world == 3 else None):
            ours = costs.pipeline_rank(s.start, s.end, s.first, s.last, world)
            theirs = estimate(tensors, config, s, "pipeline", "auto", on_cpu, 3, 1000)
            assert ours == theirs, (world, s)
        for s in tensor_shards(6, 2):
            ours = costs.tensor_rank(s.first, 2)
            theirs = estimate(tensors, config, s, "tensor", "auto", on_cpu, 3, 1000)
            assert abs(ours.weights - theirs.weights) <= 1 and ours.kv == theirs.kv
    one = estimate(tensors, config, Shard(0, 1, 0, 6, 6), "pipeline", "auto", on_cpu, 3, 1000)
    two = estimate(tensors, config, Shard(0, 2, 0, 3, 6), "pipeline", "auto", on_cpu, 3, 1000)
    assert (one.runtime, two.runtime) == (RUNTIME_BYTES, RUNTIME_BYTES + GROUP_RANK_BYTES)
