"""Tiny deterministic llama models for tests and benchmarks, made locally with no download.

The weights are random (seeded, so the same parameters give byte-identical files) and the
tokenizer is a byte-level BPE trained on a fixed list of CPython's own sources. The result is a
real mlx-lm model directory: `mlx_lm.load(dir)` loads it and `generate` produces (meaningless) text.

Suggested sizes:

- tests (the defaults): 4 layers, hidden 128, intermediate 256, 4 heads, 2 kv heads, vocab 1024,
  float32, about 3.5 MB, made in well under a second.
- benchmarks, a 1.6 GB model in four shards (about 400M parameters, float32 since that is the
  fast path on CPU)::

      python -m tests.models.tiny OUT --layers 32 --hidden 1024 --intermediate 2560 \\
          --heads 16 --kv-heads 4 --vocab 32000 --shards-files 4

  (`BENCH_PARAMS` holds these; hidden 1536 / intermediate 4096 would be 3.6 GB in float32.)

CLI: ``python -m tests.models.tiny OUT_DIR [--layers N ...] [--force]`` prints the model
directory as the last line of stdout. mlx, mlx-lm and tokenizers are imported only when a model
is actually built, so the cached case and `corrupt_model` stay cheap for callers that must not
import them (the test process, the daemon).
"""

from __future__ import annotations

import json
import shutil
import struct
import sysconfig
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import click

from exod.models._io import build_atomically, log, tokenizer_config, write_json

# Bump when the output for the same parameters changes, so cached directories get rebuilt.
GENERATOR_VERSION = 1

BOS, EOS, PAD = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
SPECIAL_TOKENS = (PAD, BOS, EOS)  # ids 0, 1, 2: the trainer puts special tokens first

# ChatML, the format SmolLM2 and many others use.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# ChatML with tools, in the JSON-in-tags way many models call tools (Qwen 2.5, Hermes): the tool
# list in the system turn, each call as <tool_call>{"name": ..., "arguments": {...}}</tool_call>,
# each result in a <tool_response> of a user turn, an assistant's reasoning_content in a think
# block before its text (as Qwen3's template shows it). mlx-lm reads it as its `json_tools` format.
TOOL_CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "Tools you may call:\n<tools>\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools>\n"
    "Call one by writing <tool_call>\n{\"name\": ..., \"arguments\": {...}}\n</tool_call>"
    "<|im_end|>\n"
    "{% elif messages[0].role == 'system' %}"
    "<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'tool' %}"
    "<|im_start|>user\n<tool_response>\n{{ message.content }}\n</tool_response><|im_end|>\n"
    "{% elif message.role == 'assistant' %}<|im_start|>assistant\n"
    "{% if message.reasoning_content %}<think>\n{{ message.reasoning_content }}\n</think>\n\n"
    "{% endif %}{{ message.content }}"
    "{% for tool_call in message.tool_calls or [] %}"
    "{% if tool_call.function is defined %}{% set tool_call = tool_call.function %}{% endif %}"
    "<tool_call>\n{\"name\": \"{{ tool_call.name }}\", \"arguments\": "
    "{{ tool_call.arguments | tojson }}}\n</tool_call>"
    "{% endfor %}<|im_end|>\n"
    "{% elif message.role != 'system' or not loop.first %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Stdlib modules present in every CPython 3.10+ (as foo.py or foo/__init__.py). Their text differs
# between Python versions, so the tokenizer is deterministic per interpreter, not across them.
CORPUS_MODULES = (
    "argparse", "ast", "asyncio/base_events", "calendar", "collections", "configparser",
    "contextlib", "dataclasses", "difflib", "email/message", "enum", "fractions", "functools",
    "gettext", "heapq", "http/client", "inspect", "json/decoder", "locale", "logging", "os",
    "pickle", "pydoc", "random", "shutil", "statistics", "string", "subprocess", "tarfile",
    "textwrap", "threading", "typing", "unittest/case", "urllib/parse", "zipfile",
)

DType = Literal["float32", "bfloat16", "float16"]

CONTEXT = 131072

# The benchmark model of the docstring: 1.61 GB on disk, made in about 9 s.
BENCH_PARAMS: dict[str, int] = {
    "layers": 32, "hidden": 1024, "intermediate": 2560, "heads": 16, "kv_heads": 4,
    "vocab": 32000, "shards_files": 4,
}


@dataclass(frozen=True)
class TinySpec:
    layers: int = 4
    hidden: int = 128
    intermediate: int = 256
    heads: int = 4
    kv_heads: int = 2
    vocab: int = 1024
    seed: int = 0
    dtype: DType = "float32"
    shards_files: int = 1

    def validate(self) -> None:
        if min(self.layers, self.hidden, self.intermediate, self.heads, self.kv_heads) < 1:
            raise ValueError("layers, hidden, intermediate, heads and kv_heads must be >= 1")
        if self.hidden % self.heads or (self.hidden // self.heads) % 2:
            raise ValueError("hidden must be a multiple of heads with an even head size (RoPE)")
        if self.heads % self.kv_heads:
            raise ValueError("heads must be a multiple of kv_heads")
        if self.vocab < 256 + len(SPECIAL_TOKENS):
            raise ValueError("vocab must hold the 256 byte tokens and the special tokens")
        if not 1 <= self.shards_files <= self.layers:
            raise ValueError("shards_files must be between 1 and the number of layers")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"unsupported dtype {self.dtype!r}")

    def config(self) -> dict[str, Any]:
        """config.json: what mlx-lm's llama needs, plus the usual HF keys for other readers."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.hidden // self.heads,
            "vocab_size": self.vocab,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "rope_traditional": False,
            # The context window: exod caps max_tokens at it. Large, as real models have, so that
            # tests can run generations long enough to stop or cancel mid-way (plain RoPE does
            # not depend on it).
            "max_position_embeddings": CONTEXT,
            "hidden_act": "silu",
            "tie_word_embeddings": False,
            "bos_token_id": SPECIAL_TOKENS.index(BOS),
            "eos_token_id": SPECIAL_TOKENS.index(EOS),
            "torch_dtype": self.dtype,
        }


def make_tiny_model(
    out_dir: Path,
    *,
    layers: int = 4,
    hidden: int = 128,
    intermediate: int = 256,
    heads: int = 4,
    kv_heads: int = 2,
    vocab: int = 1024,
    seed: int = 0,
    dtype: str = "float32",
    shards_files: int = 1,
    force: bool = False,
) -> Path:
    """Make (or reuse) a tiny llama model directory at `out_dir` and return its absolute path."""
    spec = TinySpec(layers, hidden, intermediate, heads, kv_heads, vocab, seed,
                    dtype, shards_files)  # type: ignore[arg-type]  # checked by validate()
    spec.validate()
    params = {"generator": "tests.models.tiny", "version": GENERATOR_VERSION, **asdict(spec)}
    return build_atomically(Path(out_dir), params, lambda d: _build(spec, d), force=force)


def _build(spec: TinySpec, out: Path) -> None:
    config = spec.config()
    write_json(out / "config.json", config)
    _write_tokenizer(spec.vocab, out)
    _write_weights(spec, config, out)


def with_tiny_body(src_dir: Path, out_dir: Path, *, layers: int = 2, hidden: int = 64,
                   intermediate: int = 128, heads: int = 2, kv_heads: int = 1,
                   seed: int = 0, force: bool = False) -> Path:
    """A model with `src_dir`'s tokenizer and chat template (its vocabulary, its special
    tokens) and a tiny random llama body: a real vocabulary at a fraction of the step's cost,
    so what is measured around a step (a grammar's masks: bench.agent_constrained) shows."""
    src_dir = Path(src_dir)
    src = json.loads((src_dir / "config.json").read_text())
    spec = TinySpec(layers, hidden, intermediate, heads, kv_heads, int(src["vocab_size"]), seed)
    spec.validate()
    params = {"generator": "tests.models.tiny", "version": GENERATOR_VERSION,
              "tokenizer_from": str(src_dir.resolve()), **asdict(spec)}

    def build(out: Path) -> None:
        config = {**spec.config(), "bos_token_id": src.get("bos_token_id"),
                  "eos_token_id": src.get("eos_token_id")}
        write_json(out / "config.json", config)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copyfile(src_dir / name, out / name)
        _write_weights(spec, config, out)

    return build_atomically(Path(out_dir), params, build, force=force)


def _corpus() -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = []
    for name in sorted(CORPUS_MODULES):
        for candidate in (stdlib / f"{name}.py", stdlib / name / "__init__.py"):
            if candidate.is_file():
                texts.append(candidate.read_text(encoding="utf-8", errors="replace"))
                break
    if not texts:
        raise RuntimeError(f"no Python sources found under {stdlib} to train a tokenizer on")
    return texts


def _write_tokenizer(vocab: int, out: Path) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    # Digits one by one, then GPT-2 byte-level splitting: SmolLM2's scheme.
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(), trainer)
    # Large vocabularies can outrun the corpus; reserved tokens (as Llama 3 has) fill the rest so
    # the tokenizer covers every row of the embedding.
    missing = vocab - tokenizer.get_vocab_size()
    if missing > 0:
        tokenizer.add_special_tokens([
            AddedToken(f"<|reserved_{i}|>", special=True, normalized=False)
            for i in range(missing)
        ])
    tokenizer.save(str(out / "tokenizer.json"))
    write_json(out / "tokenizer_config.json", tokenizer_config(
        bos=BOS, eos=EOS, pad=PAD, unk=None, chat_template=CHAT_TEMPLATE, max_length=2048))


def _shard_of(name: str, spec: TinySpec) -> int:
    """Which file a tensor goes to: contiguous layer ranges, embeddings first, head last."""
    if name.startswith("model.layers."):
        layer = int(name.split(".")[2])
        return layer * spec.shards_files // spec.layers
    return 0 if name.startswith("model.embed_tokens") else spec.shards_files - 1


def _write_weights(spec: TinySpec, config: dict[str, Any], out: Path) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import llama

    mx.random.seed(spec.seed)
    # Module construction only records lazy random ops (in a fixed order, hence determinism);
    # nothing is computed until a shard is saved, so at most one shard is ever in memory.
    model = llama.Model(llama.ModelArgs.from_dict(config))
    pending: dict[str, Any] = dict(tree_flatten(model.parameters()))
    del model
    dtype = getattr(mx, spec.dtype)
    n = spec.shards_files
    weight_map: dict[str, str] = {}
    total = 0
    for shard in range(n):
        file = "model.safetensors" if n == 1 else f"model-{shard + 1:05d}-of-{n:05d}.safetensors"
        names = sorted(k for k in pending if _shard_of(k, spec) == shard)
        arrays = {k: pending.pop(k).astype(dtype) for k in names}
        mx.save_safetensors(str(out / file), arrays, metadata={"format": "mlx"})
        total += sum(a.nbytes for a in arrays.values())
        weight_map.update(dict.fromkeys(names, file))
        del arrays  # free this shard before the next one is computed
    if n > 1:
        write_json(out / "model.safetensors.index.json",
                   {"metadata": {"total_size": total}, "weight_map": weight_map})


def with_tool_template(src_dir: Path, out_dir: Path) -> Path:
    """A copy of a model whose chat template takes tools (TOOL_CHAT_TEMPLATE)."""
    src_dir, out_dir = Path(src_dir), Path(out_dir)
    shutil.copytree(src_dir, out_dir, ignore=shutil.ignore_patterns(".exod-*"))
    path = out_dir / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["chat_template"] = TOOL_CHAT_TEMPLATE
    write_json(path, config)
    return out_dir


def corrupt_model(
    src_dir: Path, out_dir: Path, how: Literal["truncate", "header", "forward"] = "truncate"
) -> Path:
    """Copy a model and damage it so that loading it, or its first token, raises an error.

    "truncate" cuts the first safetensors file in half (the header points past the end);
    "header" overwrites its JSON header with garbage. "forward" keeps every file valid and every
    shape right, but stores the last layer's input norm as complex64: the model loads, and its
    first forward fails (mlx has no complex norm). The stamp is dropped so the copy never
    passes for a good model.
    """
    src_dir, out_dir = Path(src_dir), Path(out_dir)
    shutil.copytree(src_dir, out_dir, ignore=shutil.ignore_patterns(".exod-*"))
    if how == "forward":
        _complex_last_norm(out_dir)
        return out_dir
    target = min(out_dir.glob("model*.safetensors"))
    size = target.stat().st_size
    with target.open("r+b") as f:
        if how == "truncate":
            f.truncate(size // 2)
        elif how == "header":
            # The first 8 bytes are the header length; garble what follows. ASCII on purpose:
            # mlx turns a parse error quoting non-UTF-8 bytes into a bare UnicodeDecodeError.
            f.seek(8)
            f.write(b"{not json, not a safetensors header")
        else:
            raise ValueError(f"unknown corruption {how!r}")
    return out_dir


def _complex_last_norm(model_dir: Path) -> None:
    """Rewrite the safetensors file holding the last layer's input norm with that tensor as
    complex64 (each float32 value v becomes v + 0i): plain file work, no mlx."""
    for file in sorted(model_dir.glob("model*.safetensors")):
        raw = file.read_bytes()
        n = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8:8 + n])
        data = raw[8 + n:]
        norms = sorted((k for k in header if k.endswith(".input_layernorm.weight")),
                       key=lambda k: int(k.split(".layers.")[1].split(".")[0]))
        if not norms:
            continue
        out, parts = {"__metadata__": header.get("__metadata__", {})}, []
        at = 0
        for key, info in header.items():
            if key == "__metadata__":
                continue
            start, end = info["data_offsets"]
            chunk = data[start:end]
            if key == norms[-1]:
                values = struct.unpack(f"<{len(chunk) // 4}f", chunk)
                chunk = struct.pack(f"<{2 * len(values)}f",
                                    *(x for v in values for x in (v, 0.0)))
                info = {**info, "dtype": "C64"}
            out[key] = {**info, "data_offsets": [at, at + len(chunk)]}
            parts.append(chunk)
            at += len(chunk)
        text = json.dumps(out).encode()
        file.write_bytes(len(text).to_bytes(8, "little") + text + b"".join(parts))
        return
    raise ValueError(f"{model_dir}: no layer norm to damage")


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("out_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--layers", default=TinySpec.layers, show_default=True)
@click.option("--hidden", default=TinySpec.hidden, show_default=True)
@click.option("--intermediate", default=TinySpec.intermediate, show_default=True)
@click.option("--heads", default=TinySpec.heads, show_default=True)
@click.option("--kv-heads", default=TinySpec.kv_heads, show_default=True)
@click.option("--vocab", default=TinySpec.vocab, show_default=True)
@click.option("--seed", default=TinySpec.seed, show_default=True)
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]),
              default=TinySpec.dtype, show_default=True)
@click.option("--shards-files", default=TinySpec.shards_files, show_default=True,
              help="Number of safetensors files (with an index when > 1).")
@click.option("--tokenizer-from", type=click.Path(file_okay=False, path_type=Path),
              help="Keep this model's tokenizer and chat template (and its vocabulary) instead "
                   "of training one: a tiny body with a real vocabulary.")
@click.option("--force", is_flag=True, help="Rebuild even if OUT_DIR is already complete.")
def main(out_dir: Path, force: bool, tokenizer_from: Path | None, **params: Any) -> None:
    """Make a tiny random llama model in OUT_DIR and print its path (last line of stdout)."""
    try:
        if tokenizer_from is not None:
            body = {k: params[k] for k in ("layers", "hidden", "intermediate", "heads",
                                           "kv_heads", "seed")}
            path = with_tiny_body(tokenizer_from, out_dir, force=force, **body)
        else:
            path = make_tiny_model(out_dir, force=force, **params)
    except (ValueError, FileExistsError) as e:
        raise click.UsageError(str(e)) from e
    log(f"tiny model ready in {path}")
    click.echo(str(path))


if __name__ == "__main__":
    main()
