"""A zoo of tiny models, one per mlx-lm text family, made from mlx-lm's own classes.

Each family's model is built with `mlx_lm.utils._get_classes(config)` from a small config
(a shared base plus what the family needs), given seeded random weights, optionally quantized,
and saved as a real model directory next to the tiny test tokenizer (exod.models.tiny), so
`mlx_lm.load` loads it as it would a checkpoint. Nothing is downloaded and nothing binary is
kept in the repository: tests and `python -m bench families` make the zoo when they need it.

`FAMILIES` maps each family exod tests to its config; `NOT_TINY` lists mlx-lm modules that are
not in the zoo, with the reason.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import click

from exod.models._io import build_atomically, write_json

GENERATOR_VERSION = 1
H = 64  # hidden size: 4 heads of 16, split in 2 for tensor parallelism

BASE: dict[str, Any] = {
    "hidden_size": H, "num_hidden_layers": 4, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 1024,
    "rms_norm_eps": 1e-5, "layer_norm_eps": 1e-5, "norm_eps": 1e-5, "layer_norm_epsilon": 1e-5,
    "rope_theta": 10000.0, "max_position_embeddings": 512, "tie_word_embeddings": False,
    "hidden_act": "silu", "attention_bias": False, "partial_rotary_factor": 1.0,
    # MoE families
    "num_experts": 4, "num_experts_per_tok": 2, "n_routed_experts": 4, "num_local_experts": 4,
    "moe_intermediate_size": 64, "n_shared_experts": 1, "shared_expert_intermediate_size": 64,
    "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1, "moe_layer_freq": 1,
    "routed_scaling_factor": 1.0, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "norm_topk_prob": True,
    # low-rank attention (deepseek and kin)
    "kv_lora_rank": 16, "q_lora_rank": None, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
    "v_head_dim": 16,
    "sliding_window": 8,
}

# Family -> what its config needs on top of BASE. Sliding windows of 8 positions and patterns
# of 2 make the tests' prompts cross both kinds of layer.
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {}, "mistral": {}, "qwen2": {}, "qwen3": {}, "qwen3_moe": {}, "qwen2_moe": {},
    "mixtral": {}, "phi3": {}, "phimoe": {}, "olmoe": {}, "olmo2": {}, "olmo3": {},
    "cohere": {}, "cohere2": {"sliding_window_pattern": 2}, "gemma": {}, "gemma2": {},
    "gemma3_text": {"sliding_window_pattern": 2, "query_pre_attn_scalar": 16},
    "gemma3": {"text_config": {"sliding_window_pattern": 2, "query_pre_attn_scalar": 16,
                               "hidden_size": H, "num_hidden_layers": 4,
                               "intermediate_size": 128, "num_attention_heads": 4,
                               "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 1024,
                               "sliding_window": 8}},
    "deepseek": {}, "deepseek_v3": {}, "glm4": {},
    "glm4_moe": {"rope_scaling": None, "use_qk_norm": True},
    "gpt_oss": {"num_local_experts": 4, "layer_types": None},
    "lfm2": {"conv_bias": False, "conv_L_cache": 3, "block_dim": H, "block_multiple_of": 32,
             "block_ffn_dim_multiplier": 1.0, "block_auto_adjust_ff_dim": False,
             "block_ff_dim": 128, "full_attn_idxs": [1, 3]},
    "smollm3": {"no_rope_layer_interval": 2},
    "starcoder2": {}, "internlm2": {}, "internlm3": {}, "exaone": {"num_layers": 4}, "granite": {
        "logits_scaling": 1.0, "attention_multiplier": 0.25, "embedding_multiplier": 1.0,
        "residual_multiplier": 1.0, "mlp_bias": False},
    "minicpm": {"dim_model_base": H, "scale_depth": 1.0, "scale_emb": 1.0},
    "stablelm": {"use_qkv_bias": False, "partial_rotary_factor": 0.5},
    "helium": {"mlp_bias": False}, "ernie4_5": {"use_bias": False},
    "ministral3": {"rope_parameters": {"rope_theta": 10000.0, "rope_type": "default",
                                      "llama_4_scaling_beta": 0.0,
                                      "original_max_position_embeddings": 512}},
    "seed_oss": {}, "hunyuan_v1_dense": {}, "nemotron": {"hidden_act": "relu2"},
    "qwen3_5": {}, "dots1": {}, "telechat3": {}, "youtu_llm": {}, "mimo": {},
    "gpt2": {"n_layer": 4, "n_head": 4, "n_embd": H, "n_positions": 512, "n_ctx": 512},
    "phi": {"rotary_dim": 8},
    "falcon_h1": {}, "Klear": {}, "glm4_moe_lite": {}, "iquestloopcoder": {}, "laguna": {},
    "muse_glimmer": {}, "nanbeige": {}, "nanochat": {}, "plamo2": {}, "plamo3": {},
    "qwen2_vl": {}, "qwen3_vl": {}, "qwen3_5_moe": {}, "solar_open": {}, "talkie": {},
}

# Quantized variants the tests serve too.
QUANTIZED = ("llama", "qwen2", "qwen3", "qwen3_moe")

# (zoo name, layout) -> why exod refuses it; the zoo test checks that the probe refuses
# exactly these.
KNOWN_REFUSALS: dict[tuple[str, str], str] = {}

NOT_TINY: dict[str, str] = {
    "bitnet": "its kernels need Metal",
    "gemma4": "the smallest config still builds 35 layers (minutes on CPU)",
    "olmo": "needs the ai2-olmo package",
    "exaone4": "mlx-lm wants sliding_window_pattern as a string (\"LLLG\"), and transformers "
               "(loading the tokenizer) then fails on it",
}


def family_config(family: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    extra = {**FAMILIES[family], **(overrides or {})}
    config = {**BASE, **extra, "model_type": family}
    if "text_config" in extra:  # a multimodal wrapper: the text model keeps the settings
        text = {**BASE, **extra["text_config"], "model_type": f"{family}_text"}
        config = {"model_type": family, "text_config": text, "vocab_size": BASE["vocab_size"]}
    config.update({"bos_token_id": 1, "eos_token_id": 2})
    return config


def make_family_model(out_dir: Path, family: str, *, bits: int | None = None,
                      seed: int = 0, overrides: dict[str, Any] | None = None,
                      force: bool = False) -> Path:
    """Make (or reuse) the tiny model of `family` at `out_dir`; `bits` quantizes it;
    `overrides` change its config (benchmarks make bigger ones)."""
    if family not in FAMILIES:
        raise ValueError(f"no tiny config for family {family!r}")
    params = {"generator": "exod.models.zoo", "version": GENERATOR_VERSION, "family": family,
              "bits": bits, "seed": seed, "config": FAMILIES[family],
              "overrides": overrides or {}}
    return build_atomically(Path(out_dir), params,
                            lambda d: _build(family, bits, seed, overrides, d), force=force)


def _build(family: str, bits: int | None, seed: int, overrides: dict[str, Any] | None,
           out: Path) -> None:
    import mlx.core as mx
    from mlx import nn
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes

    config = family_config(family, overrides)
    model_cls, args_cls = _get_classes(config)
    mx.random.seed(seed)
    model = model_cls(args_cls.from_dict(config))
    if bits is not None:
        nn.quantize(model, group_size=32, bits=bits)
        config["quantization"] = {"group_size": 32, "bits": bits}
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    write_json(out / "config.json", config)
    _copy_tokenizer(out)


def _copy_tokenizer(out: Path) -> None:
    """The tiny test tokenizer (vocab 1024), trained once and copied into every model."""
    from exod.models.tiny import _write_tokenizer

    cache = out.parent / ".zoo-tokenizer"
    if not (cache / "tokenizer_config.json").is_file():
        tmp = out.parent / f".zoo-tokenizer.{out.name}"
        tmp.mkdir(parents=True, exist_ok=True)
        _write_tokenizer(BASE["vocab_size"], tmp)
        try:
            tmp.rename(cache)
        except OSError:  # another builder won
            shutil.rmtree(tmp, ignore_errors=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(cache / name, out / name)


def reference_text(model_dir: Path, prompt: str, max_tokens: int, ban: int) -> str:
    """What in-process mlx-lm generates, greedily, with token `ban` made impossible (as a
    client's logit_bias of -100 does), in float32 as the runner computes on CPU."""
    import mlx.core as mx
    from mlx_lm import load, stream_generate
    from mlx_lm.sample_utils import make_logits_processors

    model, tokenizer = load(str(model_dir))[:2]
    model.set_dtype(mx.float32)
    processors = make_logits_processors(logit_bias={ban: -100.0})
    return "".join(r.text for r in stream_generate(
        model, tokenizer, prompt, max_tokens=max_tokens, sampler=lambda x: mx.argmax(x, -1),
        logits_processors=processors))


def zoo_name(family: str, bits: int | None) -> str:
    return family if bits is None else f"{family}-q{bits}"


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("root", type=click.Path(file_okay=False, path_type=Path))
@click.argument("families", nargs=-1)
@click.option("--prompt", default=None, help="Also generate greedily from this prompt.")
@click.option("--max-tokens", default=12, show_default=True)
@click.option("--ban", default=2, show_default=True, help="Token id never generated (EOS).")
@click.option("--set", "sets", multiple=True, metavar="KEY=JSON",
              help="Override a config key (for bigger models), e.g. --set hidden_size=1024.")
def main(root: Path, families: tuple[str, ...], prompt: str | None, max_tokens: int,
         ban: int, sets: tuple[str, ...]) -> None:
    """Make the tiny models of FAMILIES (FAMILY or FAMILY:BITS; default: every family) under
    ROOT; print one JSON object: name -> {"path", and with --prompt "text"}."""
    try:
        overrides = {k: json.loads(v) for k, _, v in (x.partition("=") for x in sets)}
    except ValueError as e:
        raise click.UsageError(f"--set: {e}") from e
    out: dict[str, dict[str, str]] = {}
    for spec in families or tuple(FAMILIES):
        family, _, bits_text = spec.partition(":")
        bits = int(bits_text) if bits_text else None
        name = zoo_name(family, bits)
        try:
            path = make_family_model(root / name, family, bits=bits, overrides=overrides)
        except ValueError as e:
            raise click.UsageError(str(e)) from e
        out[name] = {"path": str(path)}
        if prompt is not None:
            out[name]["text"] = reference_text(path, prompt, max_tokens, ban)
    click.echo(json.dumps(out))


if __name__ == "__main__":
    main()
