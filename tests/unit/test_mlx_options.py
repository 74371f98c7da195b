"""mlx-lm's options of an instance: each refused where it cannot work, at its file:line:column
with the reason; the runner's argv; the memory estimate of a quantized or rotating cache and of
a draft model; the wired-memory seam of macOS (with a fake mlx: there is no Metal here)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from exod.config import ConfigError, Instance, explain_keys, load_config
from exod.config.mlx_options import check_mlx_options, describe, idle_cache_keys, turn_reason
from exod.core.memory import KvSpec, cache_bytes, kv_bytes
from exod.core.shards import Shard
from exod.wire.options import RunnerOptions
from exod.core.hub_ref import HubRef
from exod.wire.protocol import decode_as, to_wire
from exod.runner import wired
from tests.unit.conftest import ConfigDir

def sent(inst: Instance) -> RunnerOptions:
    """The options a runner of `inst` receives in its spec, as its end decodes them."""
    from exod.wire.specs import runner_options

    got: RunnerOptions = decode_as(to_wire(runner_options(inst)), RunnerOptions)
    return got


LLAMA = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 128,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1024}


def problems(d: ConfigDir, body: str) -> list[str]:
    d.model("m", LLAMA)
    path = d.write("exod.yaml", "instances:\n  x:\n    model: m\n" + body)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return [str(p).removeprefix(f"{path}:") for p in info.value.problems]


BAD = [
    ("kv_group_size: 32\n", "4:20: instances.x.kv_group_size: applies only with `kv_bits`"),
    ("quantized_kv_start: 0\n", "4:25: instances.x.quantized_kv_start: applies only with"),
    ("num_draft_tokens: 4\n", "4:23: instances.x.num_draft_tokens: applies only with "
                              "`draft_model`"),
    ("kv_bits: 7\n", "4:14: instances.x.kv_bits: must be one of 2, 3, 4, 5, 6, 8"),
    ("kv_bits: 4\nkv_group_size: 48\n", "5:20: instances.x.kv_group_size: must be one of 32"),
    ("kv_bits: 4\n", "4:14: instances.x.kv_bits: kv_group_size 64 does not divide the model's "
                     "head dimension 32"),
    ("kv_bits: 4\nkv_group_size: 32\nmax_kv_size: 64\n",
     "6:18: instances.x.max_kv_size: cannot go with kv_bits: mlx-lm cannot quantize a rotating"),
    ("draft_model: m\nmax_kv_size: 64\n", "5:18: instances.x.max_kv_size: cannot go with "
                                          "draft_model"),
    ("max_kv_size: 4\n", "4:18: instances.x.max_kv_size: must be at least 8"),
    # past int32 every request failed in mlx's batch step (std::bad_cast)
    ("max_kv_size: 99999999999999999999\n",
     "4:18: instances.x.max_kv_size: must be at most 1073741824, "),
    ("num_draft_tokens: 0\ndraft_model: m\n", "4:23: instances.x.num_draft_tokens: must be at "
                                              "least 1"),
    ("draft_model: small\n", "4:18: instances.x.draft_model: model directory"),
    ("draft_model: hf:bad name\n", "4:18: instances.x.draft_model: 'bad name' is not a hub"),
    ("draft_model: other\n", "4:18: instances.x.draft_model: its vocabulary (32000 tokens) is "
                             "not the model's (1024)"),
    ("adapters: nowhere\n", "4:15: instances.x.adapters: {d}/nowhere is not a directory"),
    ("adapters: half\n", "4:15: instances.x.adapters: {d}/half has no adapters.safetensors"),
    # A draft alone batches, with its prompt cache; beside kv_bits it serves by turns.
    ("draft_model: m\nkv_bits: 8\nkv_group_size: 32\nprompt_cache_bytes: 1000000\n",
     "7:25: instances.x.prompt_cache_bytes: has no effect here: the instance serves by turns"),
    ("wired_limit: 8GiB\n", "4:18: instances.x.wired_limit: applies only on macOS"),
    ("shards: 2\ndraft_model: m\n", "5:18: instances.x.draft_model: not with shards > 1"),
    ("shards: 2\nkv_bits: 8\nkv_group_size: 32\n", "5:14: instances.x.kv_bits: not with "
                                                   "shards > 1"),
    ("shards: 2\nadapters: half\n", "5:15: instances.x.adapters: not with shards > 1"),
    ("shards: 2\nmax_kv_size: 64\n", "5:18: instances.x.max_kv_size: not with shards > 1"),
]


@pytest.mark.parametrize("body, expected", BAD, ids=[b[1].split(":")[3] + str(i)
                                                     for i, b in enumerate(BAD)])
def test_each_option_is_refused_where_it_cannot_work(cfg_dir: ConfigDir, body: str,
                                                     expected: str) -> None:
    cfg_dir.model("other", {**LLAMA, "vocab_size": 32000})
    (cfg_dir.root / "half").mkdir()
    (cfg_dir.root / "half" / "adapter_config.json").write_text("{}")
    expected = expected.replace("{d}", str(cfg_dir.root))
    found = problems(cfg_dir, "".join(f"    {line}\n" for line in body.splitlines()))
    assert any(p.startswith(expected) for p in found), found


def test_every_option_together_where_it_can_work(cfg_dir: ConfigDir) -> None:
    cfg_dir.model("m", LLAMA)
    cfg_dir.model("draft", {**LLAMA, "num_hidden_layers": 1})
    adapter = cfg_dir.root / "adapter"
    adapter.mkdir()
    for name in ("adapter_config.json", "adapters.safetensors"):
        (adapter / name).write_text("{}")
    path = cfg_dir.write("exod.yaml", """\
        instances:
          spec:
            model: m
            draft_model: draft
            num_draft_tokens: 5
            kv_bits: 4
            kv_group_size: 32
            quantized_kv_start: 256
            adapters: adapter
          rot:
            model: m
            max_kv_size: 1024
          hub:
            model: m
            draft_model: hf:org/draft@v2
        """)
    cfg = load_config(path)
    spec, rot, hub = cfg.instances["spec"], cfg.instances["rot"], cfg.instances["hub"]
    assert (spec.kv_bits, spec.kv_group_size, spec.quantized_kv_start) == (4, 32, 256)
    assert spec.draft_model == cfg_dir.root / "draft" and spec.adapters == adapter
    assert hub.draft_hub == HubRef("org/draft", "v2")
    got = sent(spec)
    assert (got.kv_bits, got.kv_group_size, got.quantized_kv_start) == (4, 32, 256)
    assert (got.draft_model, got.num_draft_tokens) == (cfg_dir.root / "draft", 5)
    assert got.adapters == adapter and got.max_kv_size is None
    assert sent(rot).max_kv_size == 1024 and sent(rot).kv_bits is None
    assert sent(Instance(name="plain", model=Path("m"))) == RunnerOptions()
    (line,) = describe(spec)
    assert "KV cache 4-bit (group 32, from token 256)" in line
    assert "serves requests by turns, not batched: speculative decoding" in line
    assert describe(rot) == ["rot: rotating KV cache of 1024 tokens"]
    # A draft alone batches (exod.runner.serving.speculative); with kv_bits, by turns.
    assert describe(hub) == ["hub: speculative decoding with hf:org/draft@v2, 3 draft tokens a "
                             "step"]


def test_a_quantized_kv_cache_batches_with_its_prompt_cache() -> None:
    """kv_bits alone: the batch engine serves it (exod.runner.serving.quantized_batch), so the
    prompt cache's keys take effect; in a group it is still refused (BAD above)."""
    q8 = Instance(name="q8", model=Path("m"), kv_bits=8, kv_group_size=32,
                  prompt_cache_bytes=1 << 20, prompt_cache_disk_bytes=1 << 30)
    assert turn_reason(q8) is None and idle_cache_keys(q8) is None
    written = {"kv_bits", "kv_group_size", "prompt_cache_bytes", "prompt_cache_disk_bytes"}
    assert check_mlx_options(q8, written) == []
    assert describe(q8) == ["q8: KV cache 8-bit (group 32, from token 5000)"]


def test_a_draft_alone_keeps_its_prompt_cache_and_beside_kv_bits_serves_by_turns() -> None:
    draft = Instance(name="x", model=Path("m"), draft_model=Path("m"))
    assert turn_reason(draft) is None and idle_cache_keys(draft) is None
    both = Instance(name="x", model=Path("m"), draft_model=Path("m"), kv_bits=8)
    assert "draft_model with kv_bits" in (turn_reason(both) or "")
    assert idle_cache_keys(both) is not None


def test_wired_limit_is_taken_on_macos() -> None:
    instance = Instance(name="x", model=Path("m"), wired_limit=8 << 30)
    assert check_mlx_options(instance, {"wired_limit"}, platform="darwin") == []
    assert check_mlx_options(instance, {"wired_limit"}, platform="linux")
    assert sent(instance).wired_limit == 8 << 30


def test_explain_documents_every_option() -> None:
    text = explain_keys()
    for key in ("kv_bits", "kv_group_size", "quantized_kv_start", "max_kv_size", "draft_model",
                "num_draft_tokens", "adapters", "wired_limit"):
        assert f"instances.<name>.{key}\n" in text
    assert "draft_hub" not in text


# ---- memory ---------------------------------------------------------------------------------
def test_a_quantized_cache_is_estimated_at_its_quantized_size() -> None:
    whole = Shard(0, 1, 0, 4, 4)
    cfg: dict[str, object] = {**LLAMA, "head_dim": 32}
    values = 2 * 2 * 32 * 4  # keys and values, 2 kv heads of 32, 4 layers: per token
    plain = kv_bytes(cfg, whole, "pipeline", 4, 4096, 2)
    assert plain == values * 4 * 4096 * 2
    q8 = kv_bytes(cfg, whole, "pipeline", 4, 4096, 2, KvSpec(8, 32, 0))
    # a byte a value, and a float32 scale and bias per 32 values
    assert q8 == values * 4096 * (1 + 2 * 4 / 32) * 2
    q4 = kv_bytes(cfg, whole, "pipeline", 4, 4096, 2, KvSpec(4, 64, 0))
    assert q4 < q8 < plain
    # float until `start` tokens, both forms at the moment it is converted
    assert cache_bytes(values, 4, 100, KvSpec(8, 32, 5000)) == values * 4 * 100
    assert cache_bytes(values, 4, 4096, KvSpec(8, 32, 100)) == values * 4096 * 1.25
    assert cache_bytes(values, 4, 1100, KvSpec(8, 32, 1000)) == values * 1000 * (4 + 1.25)
    # a rotating cache never holds more than max_kv_size tokens
    assert kv_bytes(cfg, whole, "pipeline", 4, 4096, 1, KvSpec(max_size=512)) == \
        values * 4 * 512


def test_a_draft_model_adds_its_weights_and_cache(cfg_dir: ConfigDir) -> None:
    from exod.core.memory import TensorInfo, estimate

    whole = Shard(0, 1, 0, 4, 4)
    tensors = [TensorInfo("model.layers.0.w", "F32", 1000)]
    draft_tensors = [TensorInfo("model.layers.0.w", "BF16", 100)]
    alone = estimate(tensors, dict(LLAMA), whole, "pipeline", "auto", True, 1, 64)
    both = estimate(tensors, dict(LLAMA), whole, "pipeline", "auto", True, 1, 64,
                    draft=(draft_tensors, {**LLAMA, "num_hidden_layers": 1}))
    assert both.weights == alone.weights + 200  # bfloat16 runs as float32 on a CPU
    assert both.kv == alone.kv * 5 // 4


# ---- the wired-memory seam (macOS) -----------------------------------------------------------
class FakeMlx:
    """mlx.core as the seam uses it, on a Mac with Metal (or without)."""

    def __init__(self, recommended: int | None, metal: bool = True) -> None:
        self.info: dict[str, Any] = ({} if recommended is None else
                                     {"max_recommended_working_set_size": recommended})
        self.metal = SimpleNamespace(is_available=lambda: metal)
        self.set: list[int] = []

    def device_info(self) -> dict[str, Any]:
        return self.info

    def set_wired_limit(self, n: int) -> int:
        self.set.append(n)
        return 0


def test_the_wired_limit_is_mlx_lms_by_default_and_the_instances_when_set() -> None:
    mx = FakeMlx(recommended=48 << 30)
    assert wired.apply(None, mx, platform="darwin") == 48 << 30  # as mlx_lm.server sets it
    assert wired.apply(16 << 30, mx, platform="darwin") == 16 << 30
    assert wired.apply(0, mx, platform="darwin") == 0  # nothing wired: mlx's own default
    assert mx.set == [48 << 30, 16 << 30, 0]
    with pytest.raises(wired.WiredLimitError, match="more than this Mac's recommended"):
        wired.apply(64 << 30, mx, platform="darwin")


def test_no_wired_limit_without_metal() -> None:
    mx = FakeMlx(recommended=48 << 30)
    assert wired.apply(None, mx, platform="linux") is None
    no_gpu = FakeMlx(recommended=None, metal=False)
    assert wired.apply(16 << 30, no_gpu, platform="darwin") is None
    assert mx.set == no_gpu.set == []
    assert wired.apply(None, FakeMlx(recommended=None), platform="darwin") is None


def test_runner_options_reach_the_runner() -> None:
    from exod.runner.text.options import options_reason

    inst = Instance(name="x", model=Path("m"), kv_bits=8, kv_group_size=32, max_kv_size=64,
                    draft_model=Path("d"), num_draft_tokens=2, adapters=Path("a"),
                    wired_limit=100)
    got = sent(inst)
    assert (got.kv_bits, got.kv_group_size, got.max_kv_size, got.num_draft_tokens,
            got.wired_limit) == (8, 32, 64, 2, 100)
    assert got.draft_model == Path("d") and got.adapters == Path("a")
    assert options_reason(got) is not None and "speculative" in str(options_reason(got))
    assert options_reason(sent(Instance(name="x", model=Path("m")))) is None
    json.dumps(to_wire(sent(Instance(name="x", model=Path("m")))))  # every default is plain


EYE = {**LLAMA, "vision_config": {"depth": 1}}
BERT = {"model_type": "bert", "architectures": ["BertModel"], "hidden_size": 64,
        "max_position_embeddings": 512}


@pytest.mark.parametrize("config, body, expected", [
    (EYE, "prompt_cache_disk_bytes: 1GiB\n", "4:30: instances.x.prompt_cache_disk_bytes: has no "
     "effect here: a model that sees keeps its prompt cache in RAM only"),
    (EYE, "warm: [p.txt]\n", "4:11: instances.x.warm: has no effect here: a model that sees"),
    (BERT, "prompt_cache_bytes: 1073741824\n", "4:25: instances.x.prompt_cache_bytes: has no "
     "effect here: an embedding model or a reranker keeps no prompt cache; remove it (or write "
     "0)"),
], ids=["vision disk", "vision warm", "encoder RAM"])
def test_a_prompt_cache_key_a_model_kind_does_not_keep_is_refused(
        cfg_dir: ConfigDir, config: dict[str, Any], body: str, expected: str) -> None:
    """A vision runner keeps no disk tier or warm prompts, an encoder no prompt cache at all:
    such a key written on the instance was accepted and did nothing."""
    cfg_dir.model("x-model", config)
    (cfg_dir.root / "p.txt").write_text("a prompt")
    path = cfg_dir.write("exod.yaml", f"instances:\n  x:\n    model: x-model\n    {body}")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert any(f"exod.yaml:{expected}" in p for p in str(info.value).splitlines()), info.value


def test_a_prompt_cache_default_is_not_refused_where_it_does_nothing(cfg_dir: ConfigDir) -> None:
    cfg_dir.model("eye", EYE)
    cfg_dir.model("vec", BERT)
    path = cfg_dir.write("exod.yaml", """\
        defaults: {prompt_cache_disk_bytes: 2GiB}
        instances:
          eye: {model: eye, prompt_cache_bytes: 67108864}
          vec: {model: vec}
        """)
    assert sorted(load_config(path).instances) == ["eye", "vec"]
