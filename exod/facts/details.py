"""What Ollama's clients are told of a model (/api/tags, /api/show, /api/ps), read from its files
without loading it (the daemon never imports mlx): the bytes of its files, a digest that changes
when they do, when they last changed, its family, parameter count and quantization (config.json
and the safetensors headers), and the sizes Ollama's `model_info` names.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from exod.facts.model_dir import model_config, model_limits, positive_int
from exod.core.memory import FLOAT_SIZES, HeaderError, model_tensors

# config.json's keys of the sizes model_info reports (the language model's section).
_EMBEDDING = ("hidden_size", "n_embd", "d_model")
_BLOCKS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
_HEADS = ("num_attention_heads", "n_head", "n_heads")
_KV_HEADS = ("num_key_value_heads", "n_head_kv", "num_kv_heads")
INT_SIZES = {"I8": 1, "U8": 1, "I16": 2, "U16": 2, "I32": 4, "U32": 4, "I64": 8, "U64": 8}


@dataclass(frozen=True)
class ModelFacts:
    size: int = 0  # bytes of the model's files
    digest: str = ""  # sha256 hex of their names, sizes and times (or blob names)
    modified: float = 0.0  # the newest file's mtime (seconds since the epoch)
    family: str = ""  # config.json's model_type
    parameters: int | None = None
    quantization: str = ""  # Q4, Q8, MXFP4, BF16, F16, F32
    context_length: int | None = None
    vocab_size: int | None = None
    embedding_length: int | None = None
    block_count: int | None = None
    head_count: int | None = None
    head_count_kv: int | None = None

    @property
    def parameter_size(self) -> str:
        """As Ollama shows it: `8.0B`, `135M`."""
        n = self.parameters
        if n is None:
            return ""
        if n >= 10**9:
            return f"{n / 10**9:.1f}B"
        if n >= 10**6:
            return f"{n / 10**6:.0f}M"
        return f"{n / 10**3:.0f}K"


def model_facts(model_dir: Path) -> ModelFacts:
    """Everything is read with stat() and small reads: config.json and the safetensors headers.
    A directory that is not there (a hub model not fetched yet) gives the empty facts."""
    files = _files(model_dir)
    if not files:
        return ModelFacts()
    digest = hashlib.sha256()
    size, modified = 0, 0.0
    for name, path in files:
        try:
            st = path.stat()  # through a snapshot's link to its blob
            target = os.readlink(path) if path.is_symlink() else ""
        except OSError:
            continue
        size += st.st_size
        modified = max(modified, st.st_mtime)
        # A hub blob's name is its hash: that, else the size and time, tell a change.
        mark = target.rpartition("/")[2] or f"{st.st_size}:{st.st_mtime_ns}"
        digest.update(f"{name}\0{mark}\n".encode("utf-8", "surrogateescape"))
    cfg = model_config(model_dir)
    vocab, context = model_limits(model_dir)
    params, quant = _parameters(model_dir, cfg)
    return ModelFacts(size=size, digest=digest.hexdigest(), modified=modified,
                      family=str(cfg.get("model_type") or ""), parameters=params,
                      quantization=quant, context_length=context, vocab_size=vocab,
                      embedding_length=positive_int(cfg, _EMBEDDING),
                      block_count=positive_int(cfg, _BLOCKS),
                      head_count=positive_int(cfg, _HEADS),
                      head_count_kv=positive_int(cfg, _KV_HEADS))


def _files(model_dir: Path) -> list[tuple[str, Path]]:
    try:
        return sorted((str(p.relative_to(model_dir)), p) for p in model_dir.rglob("*")
                      if not p.name.startswith(".") and p.is_file())
    except OSError:
        return []


def _parameters(model_dir: Path, cfg: dict[str, object]) -> tuple[int | None, str]:
    """(parameter count, quantization) from the weights' headers and config.json's
    `quantization` (mlx's: bits, group_size, mode). A quantized weight packs 32/bits values in
    each uint32; its scales and biases are not parameters."""
    try:
        tensors = model_tensors(model_dir)
    except (HeaderError, OSError):
        return None, ""
    quant = cfg.get("quantization") or cfg.get("quantization_config")
    bits = quant.get("bits") if isinstance(quant, dict) else None
    mode = quant.get("mode") if isinstance(quant, dict) else None
    packed = isinstance(bits, int) and not isinstance(bits, bool) and 0 < bits <= 32
    count = 0
    floats: dict[str, int] = {}
    for t in tensors:
        if packed and t.name.endswith((".scales", ".biases")):
            continue
        if t.dtype in FLOAT_SIZES:
            count += t.nbytes // FLOAT_SIZES[t.dtype]
            floats[t.dtype] = floats.get(t.dtype, 0) + t.nbytes
        elif t.dtype in ("U32", "I32") and packed:
            assert isinstance(bits, int)
            count += t.nbytes * 8 // bits
        else:
            count += t.nbytes // INT_SIZES.get(t.dtype, 1)
    if packed:
        level = str(mode).upper() if isinstance(mode, str) and mode != "affine" else f"Q{bits}"
    else:
        level = max(floats, key=lambda d: floats[d]) if floats else ""
    return count, level
