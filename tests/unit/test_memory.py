"""The memory estimator: safetensors headers only, dtypes, sharding, KV headroom, the verdict."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import pytest

from exod.core.sizes import parse_size
from exod.core.memory import (GIB, GROUP_RANK_BYTES, RUNTIME_BYTES, HeaderError, TensorInfo,
                              estimate, kv_bytes, model_tensors, read_header, refusal,
                              runtime_bytes)
from exod.core.shards import Shard, pipeline_shards, tensor_shards
from exod.paths import daemon_id


def write_safetensors(path: Path, tensors: dict[str, tuple[str, int]], sparse: bool = True
                      ) -> None:
    """A file with a valid header; the data is a hole (sparse), so any size costs no disk."""
    meta, offset = {}, 0
    for name, (dtype, nbytes) in tensors.items():
        meta[name] = {"dtype": dtype, "shape": [nbytes], "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header = json.dumps(meta).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(8 + len(header) + offset)


LAYERS = 4
CONFIG = {"num_hidden_layers": LAYERS, "num_attention_heads": 8, "num_key_value_heads": 2,
          "hidden_size": 512, "max_position_embeddings": 1024, "tie_word_embeddings": True}


def model(tmp_path: Path, dtype: str = "BF16") -> list[TensorInfo]:
    tensors = {"model.embed_tokens.weight": (dtype, 1000), "model.norm.weight": (dtype, 12)}
    for i in range(LAYERS):
        tensors[f"model.layers.{i}.mlp.weight"] = (dtype, 100)
        tensors[f"model.layers.{i}.mlp.qweight"] = ("U32", 50)  # quantized: never cast
    write_safetensors(tmp_path / "model.safetensors", tensors)
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    return model_tensors(tmp_path)


def test_header_only_and_layer_numbers(tmp_path: Path) -> None:
    tensors = model(tmp_path)
    assert len(tensors) == 2 + 2 * LAYERS
    by_name = {t.name: t for t in tensors}
    assert by_name["model.layers.3.mlp.weight"].layer == 3
    assert by_name["model.embed_tokens.weight"].layer is None
    assert by_name["model.layers.0.mlp.qweight"].nbytes == 50


def test_auto_on_cpu_doubles_bf16_but_not_integers(tmp_path: Path) -> None:
    tensors = model(tmp_path)
    whole = Shard(0, 1, 0, LAYERS, LAYERS)
    cpu = estimate(tensors, CONFIG, whole, "pipeline", "auto", True, 1, 1)
    gpu = estimate(tensors, CONFIG, whole, "pipeline", "auto", False, 1, 1)
    stored = 1012 + LAYERS * 150
    assert gpu.weights == stored
    assert cpu.weights == 2 * (1012 + LAYERS * 100) + LAYERS * 50
    assert estimate(tensors, CONFIG, whole, "pipeline", "float16", True, 1, 1).weights == stored
    assert cpu.runtime == RUNTIME_BYTES


def test_a_group_rank_counts_the_ring_buffers_whatever_the_world_and_the_model(
        tmp_path: Path) -> None:
    # mx.distributed's ring backend: two 8 MiB all-sum buffers per connection, one connection to
    # each neighbour (two to the one peer of a pair), whatever the number of ranks.
    assert GROUP_RANK_BYTES == 2 * 2 * 8 * 2**20
    assert runtime_bytes(1) == RUNTIME_BYTES
    assert {runtime_bytes(w) for w in (2, 3, 8)} == {RUNTIME_BYTES + GROUP_RANK_BYTES}
    tensors = model(tmp_path, dtype="F32")
    small = estimate(tensors, CONFIG, pipeline_shards(LAYERS, 2)[0], "pipeline", "auto", True,
                     1, 1)
    big = estimate(tensors, CONFIG, pipeline_shards(LAYERS, 2)[0], "pipeline", "auto", True,
                   16, 65536)
    assert small.runtime == big.runtime == RUNTIME_BYTES + GROUP_RANK_BYTES
    assert estimate(tensors, CONFIG, tensor_shards(LAYERS, 2)[1], "tensor", "auto", True, 1,
                    1).runtime == RUNTIME_BYTES + GROUP_RANK_BYTES


def test_pipeline_ranks_own_their_layers_and_the_ends(tmp_path: Path) -> None:
    tensors = model(tmp_path, dtype="F32")
    first, last = pipeline_shards(LAYERS, 2)
    untied = {**CONFIG, "tie_word_embeddings": False}
    e0 = estimate(tensors, untied, first, "pipeline", "auto", True, 1, 1)
    e1 = estimate(tensors, untied, last, "pipeline", "auto", True, 1, 1)
    assert e0.weights == 1000 + 12 + 2 * 150  # embeddings on the first rank only
    assert e1.weights == 12 + 2 * 150
    tied = estimate(tensors, CONFIG, last, "pipeline", "auto", True, 1, 1)
    assert tied.weights == e0.weights  # a tied head needs the embeddings on the last rank too
    t0 = estimate(tensors, CONFIG, tensor_shards(LAYERS, 2)[0], "tensor", "auto", True, 1, 1)
    assert t0.weights == 1012 + LAYERS * 150 // 2


def test_kv_headroom_scales_with_concurrency_and_is_capped_by_the_model() -> None:
    whole = Shard(0, 1, 0, LAYERS, LAYERS)
    per_token = 2 * 2 * 64 * 4 * LAYERS  # k and v, 2 kv heads, head_dim 512/8, float32
    assert kv_bytes(CONFIG, whole, "pipeline", 4, 100, 3) == per_token * 100 * 3
    assert kv_bytes(CONFIG, whole, "pipeline", 4, 10**6, 1) == per_token * 1024
    half = Shard(0, 2, 0, 2, LAYERS)
    assert kv_bytes(CONFIG, half, "pipeline", 4, 100, 1) == per_token * 100 // 2


def test_refusal_names_the_figures() -> None:
    assert refusal(10 * GIB, 20 * GIB, GIB, 0) is None
    why = refusal(64 * GIB, int(22.3 * GIB), GIB, 0)
    assert why is not None and "needs 64GiB, 21.3GiB available" in why
    assert "memory_headroom 1GiB" in why
    why = refusal(8 * GIB, 10 * GIB, 0, 4 * GIB)
    assert why is not None and "6GiB available" in why and "4GiB set aside" in why


@pytest.mark.parametrize("content, problem", [
    (b"", "too short"),
    (struct.pack("<Q", 2**40), "beyond"),
    (struct.pack("<Q", 100) + b"{}", "cut short"),
    (struct.pack("<Q", 5) + b"nope!", "not JSON"),
    (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
    (struct.pack("<Q", 15) + b'{"a": {"x": 1}}', "no valid dtype"),
])
def test_bad_headers_are_one_line_errors(tmp_path: Path, content: bytes, problem: str) -> None:
    f = tmp_path / "model.safetensors"
    f.write_bytes(content)
    with pytest.raises(HeaderError, match=problem):
        read_header(f)


def test_sizes() -> None:
    assert parse_size("512MiB") == 512 * 2**20
    assert parse_size("2G") == 2 * GIB
    assert parse_size("1.5 GiB") == int(1.5 * GIB)
    assert parse_size("800MB") == 800 * 10**6
    assert parse_size(1024) == 1024
    for bad in ("-1G", "2 parsecs", "", True, "1e400G"):
        with pytest.raises(ValueError):
            parse_size(bad)


def exod_check(tmp_path: Path, body: str) -> list[str]:
    """`exod check`'s lines for a config of `body` (instances of the model `m`, made here)."""
    from click.testing import CliRunner

    from exod.cli.exod import main

    (tmp_path / "m").mkdir()
    model(tmp_path / "m")
    cfg = tmp_path / "exod.yaml"
    cfg.write_text(f"control: {{socket: {tmp_path}/c.sock}}\n{body}")
    out = CliRunner().invoke(main, ["check", "-c", str(cfg)])
    assert out.exit_code == 0, out.output
    return out.output.splitlines()


def test_exod_check_prints_each_instance_estimate(tmp_path: Path) -> None:
    lines = exod_check(tmp_path, f"instances:\n  one: {{model: {tmp_path}/m}}\n"
                                 f"  two: {{model: {tmp_path}/m, shards: 2}}\n")
    assert any(re.match(r"one: needs [\d.]+MiB \(weights [\d.]+KiB, KV cache ", ln)
               and "batch width 16 (max_concurrency unset: sized by memory, KV for 16 × 4096 "
               "tokens)" in ln for ln in lines), lines
    assert sum(ln.startswith("two: needs ") and "for rank" in ln for ln in lines) == 2
    assert any(ln.startswith("available now: ") for ln in lines)


def test_exod_check_prints_each_prompt_cache_budget(tmp_path: Path) -> None:
    m = f"{tmp_path}/m"
    lines = [ln for ln in exod_check(tmp_path, (
        f"defaults: {{prompt_cache_dir: {tmp_path}/pc}}\n"
        f"instances:\n  one: {{model: {m}}}\n"
        f"  two: {{model: {m}, shards: 2, prompt_cache_disk_bytes: 1GiB}}\n"
        f"  nodisk: {{model: {m}, prompt_cache_disk_bytes: 0}}\n"
        f"  q: {{model: {m}, kv_bits: 8}}\n")) if ln.startswith("prompt cache of ")]
    # In this daemon's own folder of the shared one: named by its config file's path.
    mine = f"{tmp_path}/pc/{daemon_id(tmp_path / 'exod.yaml')}"
    assert lines[0].startswith(f"prompt cache of one: RAM 1GiB, disk 8GiB in {mine}/one, ")
    assert lines[0].endswith(" free there now")
    assert f"disk 1GiB on each rank in {mine}/two" in lines[1]
    assert lines[2] == "prompt cache of nodisk: RAM 1GiB, disk off"
    assert lines[3].startswith(f"prompt cache of q: RAM 1GiB, disk 8GiB in {mine}/q, ")


def test_exod_check_shows_no_tier_a_model_kind_does_not_keep(tmp_path: Path) -> None:
    """A model that sees has no disk tier, an encoder no prompt cache: the defaults' budgets
    are not shown as if they were kept."""
    from tests.unit.conftest import make_model_dir

    make_model_dir(tmp_path / "eye", {"model_type": "llama", "num_hidden_layers": 4,
                                      "vision_config": {"depth": 1}})
    make_model_dir(tmp_path / "vec", {"model_type": "bert", "architectures": ["BertModel"],
                                      "hidden_size": 64, "max_position_embeddings": 512})
    lines = [ln for ln in exod_check(tmp_path, (
        f"instances:\n  eye: {{model: {tmp_path}/eye}}\n  vec: {{model: {tmp_path}/vec}}\n"))
        if ln.startswith("prompt cache of ")]
    assert lines == [
        "prompt cache of eye: RAM 1GiB, disk off (a model that sees keeps its prompt cache in "
        "RAM only (no disk tier, no warm prompts yet))",
        "prompt cache of vec: none (an embedding model or a reranker keeps no prompt cache)"]


def test_exod_check_warns_about_a_port_base_in_the_ephemeral_range(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from exod.cli.exod import main
    from exod.daemon.rank_addresses import ephemeral_range

    (tmp_path / "m").mkdir()
    model(tmp_path / "m")
    first, last = ephemeral_range()
    cfg = tmp_path / "exod.yaml"
    cfg.write_text(f"control: {{socket: {tmp_path}/c.sock}}\n"
                   f"instances:\n  two: {{model: {tmp_path}/m, shards: 2, port_base: {first}}}\n"
                   f"  out: {{model: {tmp_path}/m, shards: 2, port_base: {first - 3}}}\n")
    out = CliRunner().invoke(main, ["check", "-c", str(cfg)])
    assert out.exit_code == 0, out.output
    warned = [ln for ln in out.output.splitlines() if ln.startswith("warning: ")
              and "port_base" in ln]  # (an installed service file may add its own)
    assert warned == [f"warning: {cfg}:3:3: instances.two.port_base: port(s) {first}, "
                      f"{first + 1}, {first + 2} lie in this host's ephemeral port range "
                      f"{first}-{last}, where outgoing connections take their source ports: one "
                      "may be taken when a rank needs it (choose a port_base outside it)"], warned


def test_an_unset_max_concurrency_is_sized_by_memory() -> None:
    from exod.core.memory import AUTO_WIDTH_MAX, Estimate, auto_width

    one = [Estimate(weights=4 * GIB, kv=GIB // 2, runtime=GIB // 2)]
    assert auto_width(one, 4 * GIB) == 1  # not even the weights fit: admission will refuse
    assert auto_width(one, 6 * GIB) == 3
    assert auto_width(one, 1000 * GIB) == AUTO_WIDTH_MAX
    two_ranks = one * 2  # a group on this host: every rank's KV grows with the width
    assert auto_width(two_ranks, 12 * GIB) == 3  # (12 - 2 × 4.5) / (2 × 0.5)


def test_a_model_that_sees_keeps_its_tower_on_the_first_rank(tmp_path: Path) -> None:
    """The tower's blocks are not the language model's layers: a pipeline's first rank holds
    the tower, its projector and their needs (activations, the feature cache), whole."""
    from exod.facts.vision import tower
    from exod.core.memory import DECODE_BYTES, FEATURE_CACHE_BYTES, Tower, picture_budget

    tensors = {"language_model.model.embed_tokens.weight": ("F32", 1000),
               "vision_tower.blocks.3.attn.qkv.weight": ("F32", 4000),
               "vision_tower.merger.mlp.0.weight": ("F32", 400),
               "multi_modal_projector.linear_1.weight": ("F32", 200)}
    for i in range(LAYERS):
        tensors[f"language_model.model.layers.{i}.mlp.weight"] = ("F32", 100)
    write_safetensors(tmp_path / "model.safetensors", tensors)
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "qwen2_5_vl", "text_config": CONFIG,
        "vision_config": {"hidden_size": 64, "patch_size": 14}}))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"max_pixels": 14 * 14 * 50}))
    sight = tower(tmp_path)
    assert sight == Tower(64, 50, 14 * 14 * 50)
    loaded = model_tensors(tmp_path)
    assert sorted(t.name for t in loaded if t.vision) == [
        "multi_modal_projector.linear_1.weight", "vision_tower.blocks.3.attn.qkv.weight",
        "vision_tower.merger.mlp.0.weight"]
    first, last = pipeline_shards(LAYERS, 2)
    est = [estimate(loaded, CONFIG, s, "pipeline", "auto", True, 1, 1, tower=sight)
           for s in (first, last)]
    assert est[0].weights == 1000 + 4600 + 2 * 100
    assert est[1].weights == 1000 + 2 * 100  # the head is tied to the embedding
    # The pictures being decoded: one whole at the 50-megapixel cap, and a budget of those held
    # at the model's resolution (here its floor: the processor makes ~0.01 megapixels).
    assert picture_budget(sight) == 64 * 2**20
    assert est[0].vision == (8 * 50 * 64 * 4 + FEATURE_CACHE_BYTES + DECODE_BYTES
                             + picture_budget(sight)) and est[1].vision == 0
    assert est[0].total == est[0].weights + est[0].kv + est[0].runtime + est[0].vision
    assert "vision" in est[0].describe() and "vision" not in est[1].describe()
    assert tower(Path(tmp_path / "nothing")) is None
