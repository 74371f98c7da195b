"""How much memory a rank will need, estimated before it starts; and whether the host has it.

Read from the safetensors headers only (an 8-byte little-endian length, then that much JSON
naming each tensor's dtype and byte range): no weight is read, so a 100 GB model is estimated
in milliseconds. A rank holds the tensors it owns (its layers in a pipeline, its 1/world part of
every layer in tensor parallelism, and the non-layer tensors it uses) in the dtype it runs in
(`auto` is float32 on a CPU, so bfloat16 and float16 weights double; quantized weights keep
their size); KV cache headroom for `max_concurrency` generations of `context_tokens` each, in
the size a `kv_bits` cache takes; a draft model, whole, with its own KV cache; for a model that
sees, on the first rank only, the vision tower and projector, its activations for the largest
picture and the feature cache; and the runtime itself (a rank of a group, a little more:
`runtime_bytes`). Pure, apart from reading headers.
docs/operating.md, "Memory admission".
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from exod.core.images import MAX_IMAGES, MAX_PIXELS
from exod.core.shards import Shard
from exod.core.sizes import format_size

GIB = 2**30
RUNTIME_BYTES = 384 * 2**20  # a runner with mlx and a tokenizer loaded, before any weight
# What a rank of a group holds beyond a lone runner and its share of the weights: mx.distributed's
# ring backend keeps two 8 MiB all-sum buffers for each of its connections, one to each
# neighbour (exod writes one address a rank), so the same for any world size and model. The
# rest (control connections, stand-in blocks' position slots) is well under a MiB; stand-in
# blocks hold no weights. `python -m bench sharding` prints what a rank takes beyond its share.
# Placement counts it as memory admission does (runtime_bytes).
RING_BUFFER_BYTES = 2 * 2 * 8 * 2**20
GROUP_RANK_BYTES = RING_BUFFER_BYTES
MAX_HEADER = 100 * 2**20  # safetensors' own limit on the JSON header
FLOAT_SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1}
RUN_SIZES = {"float32": 4, "float16": 2, "bfloat16": 2}
_LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks)\.(\d+)\.")
# The tensors of a vision tower and of what joins it to the language model (mlx-vlm's names).
_VISION = re.compile(r"(?:^|\.)(?:vision_tower|vision_model|visual|multi_modal_projector|"
                     r"mm_projector|connector|image_newline)(?:\.|$)")
# Bytes of the vision tower's outputs a runner keeps for the next requests about the same
# pictures (exod.runner.vision.features).
FEATURE_CACHE_BYTES = 256 * 2**20
# Activations a tower layer holds per patch, in hidden sizes (its MLP widens 4x; residuals).
TOWER_ACTIVATIONS = 8
# A picture being decoded (exod.runner.vision.images): one at a time, whole, in the mode it is
# stored in (PIL holds 1 to 4 bytes a pixel), before it is reduced to the model's resolution.
DECODE_BYTES = MAX_PIXELS * 4
# Bytes a pixel of a picture takes once decoded at the model's resolution (PIL's RGB), and once
# the processor has made its arrays of it (float32, 3 channels; Qwen's two frames of a picture:
# 24 bytes), with their copies while they are made: measured on Qwen2.5-VL's processor at
# 12.8 megapixels, 64 at the peak and 26 held.
DECODED_BYTES_PER_PIXEL = 4
PROCESSED_BYTES_PER_PIXEL = 64
# The pictures a runner holds at the model's resolution, from a request's reading until the
# tower has seen them, across requests (exod.runner.vision.images.PictureBudget): room for
# MAX_IMAGES pictures of the processor's largest size (each decoded up to 4 times that: it is
# reduced by a whole factor), within these.
PICTURE_BYTES_MIN = 64 * 2**20
PICTURE_BYTES_MAX = 2 * 2**30


class HeaderError(ValueError):
    pass


@dataclass(frozen=True)
class TensorInfo:
    """A tensor as a safetensors header describes it: no data."""

    name: str
    dtype: str  # safetensors' name: F32, BF16, U32, ...
    nbytes: int

    @property
    def layer(self) -> int | None:
        m = _LAYER.search(self.name)
        return int(m.group(1)) if m else None

    @property
    def vision(self) -> bool:
        """Part of a vision tower or its projector (a language model's layers are not)."""
        return bool(_VISION.search(self.name))


@dataclass(frozen=True)
class KvSpec:
    """The instance's KV cache options (exod.config.schema.Instance's keys of these names)."""

    bits: int | None = None  # quantized to this many bits once `start` tokens are held
    group_size: int = 64  # values sharing a scale and a bias
    start: int = 5000
    max_size: int | None = None  # a rotating cache holds this many tokens at most


@dataclass(frozen=True)
class Tower:
    """A model's vision tower, as its config.json and its processor's files say: its width,
    and the patches and pixels of the largest picture its processor makes."""

    hidden: int
    patches: int
    pixels: int = 0


@dataclass(frozen=True)
class Estimate:
    weights: int
    kv: int
    runtime: int
    vision: int = 0  # a model that sees: its tower's activations and feature cache

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.runtime + self.vision

    def describe(self) -> str:
        sight = f", vision {format_size(self.vision)}" if self.vision else ""
        return (f"{format_size(self.total)} (weights {format_size(self.weights)}, KV cache "
                f"{format_size(self.kv)}{sight}, runtime {format_size(self.runtime)})")


# ---- reading -------------------------------------------------------------------------------
def read_header(path: Path) -> list[TensorInfo]:
    """The tensors a .safetensors file declares. Raises HeaderError (one line) or OSError."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise HeaderError(f"{path}: too short for a safetensors header")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER:
            raise HeaderError(f"{path}: header length {n} is beyond safetensors' limit")
        raw = f.read(n)
    if len(raw) < n:
        raise HeaderError(f"{path}: header cut short ({len(raw)} of {n} bytes)")
    try:
        meta = json.loads(raw)
    except ValueError as e:
        raise HeaderError(f"{path}: header is not JSON ({e})") from None
    if not isinstance(meta, dict):
        raise HeaderError(f"{path}: header is not a JSON object")
    out = []
    for name, info in meta.items():
        if name == "__metadata__":
            continue
        try:
            start, end = info["data_offsets"]
            dtype = str(info["dtype"])
            nbytes = int(end) - int(start)
        except (KeyError, TypeError, ValueError):
            raise HeaderError(f"{path}: tensor {name!r} has no valid dtype/data_offsets") from None
        if nbytes < 0:
            raise HeaderError(f"{path}: tensor {name!r} ends before it starts")
        out.append(TensorInfo(name, dtype, nbytes))
    return out


def model_tensors(model_dir: Path) -> list[TensorInfo]:
    """Every tensor of the model's weight files (mlx-lm loads `model*.safetensors`)."""
    files = sorted(model_dir.glob("model*.safetensors"))
    if not files:
        raise HeaderError(f"{model_dir}: no model*.safetensors files")
    return [t for f in files for t in read_header(f)]


# ---- estimating ------------------------------------------------------------------------------
def runtime_bytes(world: int) -> int:
    """What a rank takes before its weights and KV cache: the runtime, and a group's share."""
    return RUNTIME_BYTES + (GROUP_RANK_BYTES if world > 1 else 0)


def run_dtype(dtype: str, on_cpu: bool) -> str | None:
    """The dtype floating weights are cast to; None: they keep their own (auto on a GPU)."""
    if dtype == "auto":
        return "float32" if on_cpu else None
    return dtype


def tensor_bytes(t: TensorInfo, cast_to: str | None) -> int:
    size = FLOAT_SIZES.get(t.dtype)
    if cast_to is None or size is None:
        return t.nbytes  # kept as stored: integers (quantized), or no cast
    return t.nbytes // size * RUN_SIZES[cast_to]


def uses(t: TensorInfo, shard: Shard, parallelism: str, tied: bool) -> float:
    """The fraction of tensor `t` this rank holds."""
    layer = t.layer
    if shard.world == 1 or shard.total == 0:
        return 1.0
    if t.vision:  # the tower runs on the first rank, whole (its blocks are not the model's)
        return 1.0 if shard.first else 0.0
    if parallelism == "tensor":
        return 1.0 / shard.world if layer is not None else 1.0
    if layer is not None:
        return 1.0 if shard.start <= layer < shard.end else 0.0
    if "embed_tokens" in t.name or t.name.endswith("wte.weight"):
        return 1.0 if shard.first or (shard.last and tied) else 0.0
    if t.name.startswith("lm_head"):
        return 1.0 if shard.last else 0.0
    return 1.0


def weight_bytes(tensors: Iterable[TensorInfo], shard: Shard, parallelism: str, cast_to: str | None,
                 tied: bool) -> int:
    return int(sum(tensor_bytes(t, cast_to) * uses(t, shard, parallelism, tied)
                   for t in tensors))


def kv_bytes(config: dict[str, object], shard: Shard, parallelism: str, elem_size: int,
             tokens: int, concurrency: int, kv: KvSpec = KvSpec()) -> int:
    """Keys and values of every layer this rank runs, for `concurrency` × `tokens`."""
    heads = _int(config.get("num_attention_heads"))
    kv_heads = _int(config.get("num_key_value_heads")) or heads
    hidden = _int(config.get("hidden_size"))
    head_dim = _int(config.get("head_dim")) or (hidden // heads if heads else 0)
    layers = shard.count if (parallelism == "pipeline" and shard.total) else (
        _int(config.get("num_hidden_layers")) or shard.total)
    limit = _int(config.get("max_position_embeddings"))
    if limit:
        tokens = min(tokens, limit)
    if kv.max_size:
        tokens = min(tokens, kv.max_size)
    values = 2 * kv_heads * head_dim * layers  # per token
    if parallelism == "tensor":
        values //= max(1, shard.world)
    return cache_bytes(values, elem_size, tokens, kv) * concurrency


def cache_bytes(values: int, elem_size: int, tokens: int, kv: KvSpec) -> int:
    """One generation's cache of `tokens` tokens, `values` values each. A quantized cache packs
    `bits` per value plus a scale and a bias (in the float dtype) per group; it is float until
    it holds `start` tokens, and both forms live for a moment when it is converted (mlx-lm's
    maybe_quantize_kv_cache)."""
    def floats(n: int) -> int:
        return values * elem_size * n

    bits = kv.bits
    if bits is None:
        return floats(tokens)

    def packed(n: int) -> int:
        return -(-values * n * bits // 8) + values * n * 2 * elem_size // kv.group_size

    if tokens < kv.start:
        return floats(tokens)
    return max(floats(kv.start) + packed(kv.start), packed(tokens))


def elem_size(config: dict[str, object], cast_to: str | None) -> int:
    if cast_to is not None:
        return RUN_SIZES[cast_to]
    stored = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    return RUN_SIZES.get(stored, 2)


def vision_bytes(tower: Tower, elem: int) -> int:
    """A tower's activations for one picture at its largest, the feature cache, and the
    pictures being decoded."""
    return (TOWER_ACTIVATIONS * tower.patches * tower.hidden * elem + FEATURE_CACHE_BYTES
            + DECODE_BYTES + picture_budget(tower))


def picture_budget(tower: Tower | None) -> int:
    """Bytes of pictures at the model's resolution a runner holds at once
    (exod.runner.vision.images.PictureBudget)."""
    pixels = tower.pixels if tower is not None else 0
    one = pixels * (4 * DECODED_BYTES_PER_PIXEL + PROCESSED_BYTES_PER_PIXEL)
    return min(PICTURE_BYTES_MAX, max(PICTURE_BYTES_MIN, MAX_IMAGES * one))


def estimate(tensors: list[TensorInfo], config: dict[str, object], shard: Shard, parallelism: str,
             dtype: str, on_cpu: bool, concurrency: int, context_tokens: int,
             kv: KvSpec = KvSpec(),
             draft: tuple[list[TensorInfo], dict[str, object]] | None = None,
             tower: Tower | None = None) -> Estimate:
    """draft: the draft model's tensors and config.json (speculative decoding): its weights
    and KV cache are added, with the same options. tower: a model that sees (its weights are
    among `tensors`)."""
    cast_to = run_dtype(dtype, on_cpu)
    tied = bool(config.get("tie_word_embeddings", False))
    weights = weight_bytes(tensors, shard, parallelism, cast_to, tied)
    cache = kv_bytes(config, shard, parallelism, elem_size(config, cast_to), context_tokens,
                     concurrency, kv)
    if draft is not None:
        d_tensors, d_config = draft
        whole = Shard(0, 1, 0, 0, 0)
        weights += weight_bytes(d_tensors, whole, "pipeline", cast_to, False)
        cache += kv_bytes(d_config, whole, "pipeline", elem_size(d_config, cast_to),
                          context_tokens, concurrency, kv)
    sight = vision_bytes(tower, elem_size(config, cast_to)) \
        if tower is not None and shard.first else 0
    return Estimate(weights=weights, kv=cache, runtime=runtime_bytes(shard.world), vision=sight)


def encoder_estimate(tensors: list[TensorInfo], config: dict[str, object], dtype: str, on_cpu: bool,
                     max_tokens: int, batch_tokens: int) -> Estimate:
    """An embedding model or a reranker (exod.runner.embed): its weights, and the activations
    of its largest batch (`batch_tokens` padded tokens, each input at most `max_tokens`): a
    layer's hidden states and MLP, and its attention scores. No KV cache: nothing is kept
    between batches, so the requests in flight (the width) cost nothing more."""
    cast_to = run_dtype(dtype, on_cpu)
    weights = weight_bytes(tensors, Shard(0, 1, 0, 0, 0), "pipeline", cast_to, False)
    size = elem_size(config, cast_to)
    hidden = _int(config.get("hidden_size"))
    inner = _int(config.get("intermediate_size")) or 4 * hidden
    heads = _int(config.get("num_attention_heads"))
    longest = min(max_tokens, batch_tokens)
    states = batch_tokens * (6 * hidden + 2 * inner) * size
    scores = 2 * heads * longest * max(batch_tokens, longest) * 4  # scores and softmax, float32
    return Estimate(weights=weights, kv=0, runtime=RUNTIME_BYTES + states + scores)


AUTO_WIDTH_MAX = 16  # mlx_lm.server batches 32; a CPU host rarely gains past 16


def auto_width(one: list[Estimate], free: int, cap: int = AUTO_WIDTH_MAX) -> int:
    """The batch width memory admits when `max_concurrency` is not set: as many generations as
    their KV cache (estimated for one in `one`, per rank) fits in `free` bytes beside the
    weights, the vision tower's needs and the runtime; 1 to `cap`."""
    base = sum(e.weights + e.runtime + e.vision for e in one)
    per = sum(e.kv for e in one)
    if per <= 0:
        return cap
    return max(1, min(cap, (free - base) // per))


def refusal(needs: int, available: int, headroom: int, reserved: int) -> str | None:
    """None when `needs` fits in what is available, less the headroom and what running
    instances may still take; else the reason, with the figures."""
    free = max(0, available - headroom - reserved)
    if needs <= free:
        return None
    notes = [f"memory_headroom {format_size(headroom)}"] if headroom else []
    if reserved:
        notes.append(f"{format_size(reserved)} set aside for running instances")
    note = f" (after {' and '.join(notes)})" if notes else ""
    return f"not enough memory: needs {format_size(needs)}, {format_size(free)} available{note}"


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
