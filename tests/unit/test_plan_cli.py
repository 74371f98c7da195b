"""`placement: auto` in the config (what goes with it, at file:line:column), `exod plan` on the
nodes of `--nodes` (the plan, the refusal, `--write` and its file), and the daemon's ranks of an
auto instance on this host, with the planner's layers. Models here are safetensors headers
with no weights (what the planner reads): the layouts that need mlx are the integration tier's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from exod.cli.exod import main
from exod.cli.plan_nodes import read_nodes
from exod.config import ConfigError, load_config
from exod.config.schema import Instance
from exod.core.kinds import AUTO
from exod.core.memory import GROUP_RANK_BYTES, RUNTIME_BYTES
from exod.core.sizes import format_size
from exod.core.nodes import Link
from exod.daemon.launch import plan_shards
from exod.daemon.placing import placed_config
from tests.unit.test_memory import write_safetensors

MiB = 2**20


def fake_model(folder: Path, embed: int = 64 * MiB) -> Path:
    """12 layers of 8 MiB (float32), embeddings of `embed` bytes, a head of 4 MiB."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {"model.embed_tokens.weight": ("F32", embed), "model.norm.weight": ("F32", 512),
               "lm_head.weight": ("F32", 4 * MiB)}
    tensors.update({f"model.layers.{i}.mlp.weight": ("F32", 8 * MiB) for i in range(12)})
    write_safetensors(folder / "model.safetensors", tensors)
    (folder / "config.json").write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": 12, "num_attention_heads": 4,
        "num_key_value_heads": 2, "hidden_size": 128, "head_dim": 32,
        "max_position_embeddings": 65536, "torch_dtype": "float32"}))
    return folder


def config(tmp_path: Path, body: str, name: str = "exod.yaml") -> Path:
    path = tmp_path / name
    path.write_text(f"node: {{name: a}}\ninstances:\n  big:\n    model: {tmp_path / 'm'}\n{body}")
    return path


NODES = [{"node_id": "a", "name": "a", "backend": "cpu", "memory_usable": "720MiB",
          "addresses": ["10.0.0.1"]},
         {"node_id": "b", "name": "b", "backend": "cpu", "memory_usable": "640MiB",
          "addresses": ["10.0.0.2"]}]


def problems(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as e:
        load_config(path)
    return [str(p) for p in e.value.problems]


# ---- the config ------------------------------------------------------------------------------
def test_placement_auto_with_explicit_hosts_or_layers_is_an_error_naming_both(
        tmp_path: Path) -> None:
    fake_model(tmp_path / "m")
    path = config(tmp_path, "    placement: auto\n    hosts: [{name: a, address: 10.0.0.1}]\n"
                            "    layers: [12]\n")
    assert problems(path) == [
        f"{path}:6:12: instances.big.hosts: `hosts` and `placement: auto` cannot go together: "
        "placement auto chooses the hosts itself (remove `hosts`, or `placement`)",
        f"{path}:7:13: instances.big.layers: `layers` and `placement: auto` cannot go "
        "together: placement auto chooses the layers of each rank itself (remove `layers`, or "
        "`placement`)"]


def test_shards_auto_needs_placement_auto_and_leaves_port_base_unknown(tmp_path: Path) -> None:
    fake_model(tmp_path / "m")
    path = config(tmp_path, "    shards: auto\n")
    assert problems(path) == [f"{path}:5:13: instances.big.shards: `auto` needs `placement: "
                              "auto` (the planner chooses the number of ranks): write a number, "
                              "or add `placement: auto`"]
    path = config(tmp_path, "    placement: auto\n    port_base: 30000\n")
    assert [p.split(": ", 2)[1:] for p in problems(path)] == [
        ["instances.big.port_base", "needs a number of `shards` (with `shards: auto` the number "
                                    "of ports is not known): write a number of shards, or "
                                    "leave `port_base` out"]]


def test_placement_auto_means_shards_auto_and_the_explicit_keys_keep_working(
        tmp_path: Path) -> None:
    fake_model(tmp_path / "m")
    auto = load_config(config(tmp_path, "    placement: auto\n")).instances["big"]
    assert (auto.placement, auto.shards) == ("auto", AUTO)
    assert load_config(config(tmp_path, "    placement: auto\n    shards: auto\n")) \
        .instances["big"].shards == AUTO
    manual = load_config(config(tmp_path, "    context_tokens: 512\n")).instances["big"]
    assert (manual.placement, manual.shards, manual.hosts, manual.layers) == \
        ("manual", 1, (), None)


# ---- --nodes ---------------------------------------------------------------------------------
def test_nodes_are_read_as_a_list_or_with_links(tmp_path: Path) -> None:
    f = tmp_path / "nodes.json"
    f.write_text(json.dumps(NODES))
    nodes, links = read_nodes(f)
    assert [(n.node_id, n.memory_usable, n.addresses) for n in nodes] == [
        ("a", 720 * MiB, ("10.0.0.1",)), ("b", 640 * MiB, ("10.0.0.2",))]
    assert links == []
    f.write_text(json.dumps({"nodes": NODES, "links": [{"a": "a", "b": "b",
                                                        "seconds_per_mib": 0.01}]}))
    assert read_nodes(f)[1] == [Link("a", "b", 0.01)]


@pytest.mark.parametrize(("change", "message"), [
    ({"backend": "gpu"}, "nodes[0]: `backend` must be one of metal, cuda, cpu"),
    ({"memory_usable": "lots"}, "nodes[0]: bad size 'lots'"),
    ({"memroy_usable": 1}, "nodes[0]: unknown key 'memroy_usable'"),
    ({"node_id": "b"}, "a node_id is given twice"),
])
def test_a_bad_node_is_named(tmp_path: Path, change: dict[str, object], message: str) -> None:
    f = tmp_path / "nodes.json"
    f.write_text(json.dumps([{**NODES[0], **change}, NODES[1]]))
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        read_nodes(f)


# ---- exod plan -------------------------------------------------------------------------------
def plan(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    nodes = tmp_path / "nodes.json"
    if not nodes.exists():
        nodes.write_text(json.dumps(NODES))
    res = CliRunner().invoke(main, ["plan", "-c", str(tmp_path / "exod.yaml"),
                                    "--nodes", str(nodes), *args])
    return res.exit_code, res.stdout, res.stderr


def test_exod_plan_prints_each_rank_s_node_layers_and_bytes(tmp_path: Path) -> None:
    fake_model(tmp_path / "m")
    # One rank would need 740 MiB (164 MiB of weights, 192 of KV for 32768 tokens, the
    # runtime): two nodes, whose ranks need 1,188 MiB in all.
    config(tmp_path, "    placement: auto\n    context_tokens: 32768\n")
    code, out, err = plan(tmp_path)
    assert code == 0, err
    head, r0, r1 = out.splitlines()
    assert head.startswith("big: pipeline, 2 ranks on 2 nodes; 12 layers")
    assert r0.split()[:5] == ["rank", "0", "a", "layers", "0-5"]
    assert r1.split()[:5] == ["rank", "1", "b", "layers", "6-11"]
    assert "of 720MiB" in r0 and "of 640MiB" in r1
    assert f"runtime {format_size(RUNTIME_BYTES + GROUP_RANK_BYTES)}" in r0


def test_exod_plan_refuses_with_the_numbers_and_exits_1(tmp_path: Path) -> None:
    fake_model(tmp_path / "m")
    config(tmp_path, "    placement: auto\n    context_tokens: 65536\n")
    code, out, err = plan(tmp_path)
    assert code == 1 and out == ""
    assert "cannot place big (pipeline): one rank holding the whole model needs" in err
    assert "the nodes have a 720MiB, b 640MiB" in err
    assert "on a (has 720MiB)" in err and "on b (has 640MiB)" in err
    assert "1 instance not placed" in err


def test_exod_plan_write_gives_the_explicit_keys_and_never_overwrites(tmp_path: Path) -> None:
    fake_model(tmp_path / "m")
    key = tmp_path / "cluster.key"
    config(tmp_path, "    placement: auto\n    context_tokens: 32768  # KV\n"
                     f"    cluster_key_file: {key.name}\n")
    code, out, err = plan(tmp_path, "--write")
    assert code == 0, err
    written = yaml.safe_load(out)["instances"]["big"]
    assert written == {"model": str(tmp_path / "m"), "shards": 2, "layers": [6, 6],
                       "hosts": [{"name": "a", "address": "10.0.0.1"},
                                 {"name": "b", "address": "10.0.0.2"}],
                       "port_base": 20000, "context_tokens": 32768,
                       "cluster_key_file": str(key)}
    target = tmp_path / "placed.yaml"
    assert plan(tmp_path, "--write", "-o", str(target))[0] == 0
    assert yaml.safe_load(target.read_text()) == yaml.safe_load(out)
    target.write_text("# the operator's\n")
    code, _, err = plan(tmp_path, "--write", "-o", str(target))
    assert code == 1 and "exists: not overwritten" in err
    assert target.read_text() == "# the operator's\n"


def test_on_this_host_alone_an_auto_instance_takes_the_planner_s_layers(tmp_path: Path) -> None:
    # Embeddings of 64 MiB on rank 0 and a head of 4 on rank 1, 10 MiB a layer (weights and
    # KV): by bytes, rank 0 holds 3 layers and rank 1 nine, not 6 and 6.
    model = fake_model(tmp_path / "m")
    inst = Instance(name="big", model=model, placement="auto", shards=2)
    shards = plan_shards(inst)
    assert [(s.start, s.end, s.world) for s in shards] == [(0, 3, 2), (3, 12, 2)]
    inst = Instance(name="big", model=model, placement="auto", shards=AUTO)
    one = plan_shards(inst)
    assert [(s.start, s.end, s.world) for s in one] == [(0, 12, 1)]
    assert placed_config(inst, one).shards == 1
    # The explicit keys: an even split, as before.
    manual = Instance(name="big", model=model, shards=2)
    assert [(s.start, s.end) for s in plan_shards(manual)] == [(0, 6), (6, 12)]
