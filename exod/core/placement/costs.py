"""What a model costs the ranks that hold it, layer by layer, on one kind of node.

Read from the safetensors headers (exod.core.memory) and split as memory admission splits an
estimate (`memory.uses`), so that the rank the planner sizes is the rank admission checks: the
weights of its layers and the KV reserve of those layers (`context_tokens` × the batch), the
embeddings on the first rank (and on the last when they are tied to the head), the head on the
last, what every rank holds (norms, a draft model), a vision tower on the first, and the runtime
of a rank (`memory.runtime_bytes`).
"""

from __future__ import annotations

from dataclasses import dataclass

from exod.core.memory import (Estimate, KvSpec, TensorInfo, Tower, elem_size, kv_bytes,
                              run_dtype, runtime_bytes, tensor_bytes, vision_bytes)
from exod.core.shards import Shard


@dataclass(frozen=True)
class ModelCosts:
    """Bytes, as the model runs on one kind of node (a CPU casts `auto` to float32)."""

    layers: tuple[int, ...]  # each layer's weights
    kv_layer: int  # the KV reserve of one layer
    embed: int = 0  # the input embeddings: the first rank, and the last when tied
    head: int = 0  # the output head: the last rank
    every: int = 0  # on every rank: the other tensors outside the layers, a draft model
    every_kv: int = 0  # on every rank: a draft model's KV cache
    tower: int = 0  # a vision tower's weights: the first rank
    sight: int = 0  # its activations, feature cache and pictures: the first rank
    tied: bool = False
    heads: int = 0  # attention heads (0: unknown): tensor ranks must split them evenly

    @property
    def total(self) -> int:
        return len(self.layers)

    def pipeline_rank(self, start: int, end: int, first: bool, last: bool,
                      world: int) -> Estimate:
        """A pipeline rank holding layers [start, end)."""
        ends = (self.embed if first or (last and self.tied) else 0) + (self.head if last else 0)
        return Estimate(weights=sum(self.layers[start:end]) + ends + self.every
                        + (self.tower if first else 0),
                        kv=self.kv_layer * (end - start) + self.every_kv,
                        runtime=runtime_bytes(world), vision=self.sight if first else 0)

    def tensor_rank(self, first: bool, world: int) -> Estimate:
        """A tensor rank: its 1/world of every layer, and every tensor outside them whole."""
        return Estimate(weights=sum(self.layers) // world + self.embed + self.head + self.every
                        + (self.tower if first else 0),
                        kv=self.kv_layer * self.total // world + self.every_kv,
                        runtime=runtime_bytes(world), vision=self.sight if first else 0)


def model_costs(tensors: list[TensorInfo], config: dict[str, object], dtype: str, on_cpu: bool,
                concurrency: int, context_tokens: int, kv: KvSpec | None = None,
                draft: tuple[list[TensorInfo], dict[str, object]] | None = None,
                tower: Tower | None = None) -> ModelCosts:
    """The arguments of `memory.estimate`, for every split at once."""
    kv = kv or KvSpec()
    cast_to = run_dtype(dtype, on_cpu)
    total = _int(config.get("num_hidden_layers")) or 1 + max(
        (t.layer for t in tensors if t.layer is not None and not t.vision), default=-1)
    layers = [0] * total
    parts = {"embed": 0, "head": 0, "every": 0, "tower": 0}
    for t in tensors:
        size = tensor_bytes(t, cast_to)
        if t.vision:
            parts["tower"] += size
        elif t.layer is not None:
            if t.layer < total:  # beyond config.json's count: no rank loads it
                layers[t.layer] += size
        elif "embed_tokens" in t.name or t.name.endswith("wte.weight"):
            parts["embed"] += size
        elif t.name.startswith("lm_head"):
            parts["head"] += size
        else:
            parts["every"] += size
    elem = elem_size(config, cast_to)
    one = Shard(0, 2, 0, 1, max(total, 1))  # one layer of a pipeline rank
    every_kv = 0
    if draft is not None:
        d_tensors, d_config = draft
        parts["every"] += sum(tensor_bytes(t, cast_to) for t in d_tensors)
        every_kv = kv_bytes(d_config, Shard(0, 1, 0, 0, 0), "pipeline",
                            elem_size(d_config, cast_to), context_tokens, concurrency, kv)
    return ModelCosts(
        layers=tuple(layers), kv_layer=kv_bytes(config, one, "pipeline", elem, context_tokens,
                                                concurrency, kv),
        every_kv=every_kv, sight=vision_bytes(tower, elem) if tower is not None else 0,
        tied=bool(config.get("tie_word_embeddings", False)),
        heads=_int(config.get("num_attention_heads")), **parts)


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
