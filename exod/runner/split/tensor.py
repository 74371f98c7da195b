"""Tensor parallelism for any family built from linear projections, one block at a time.

A family's own `shard(group)` is used where mlx-lm has one. It runs once, on the lazily loaded
model before any weight is read: each block's weights are then read and sliced as that block is
evaluated, so a rank's peak memory stays its share plus one block, and a shard() that also
touches what lies outside the blocks (a vocabulary-split head) sees the model whole.

Elsewhere each block is sharded by projection role with mlx's distributed layers: the
projections that fan out (q/k/v, gate/up, ...) split by output, those that fan back in (o,
down, ...) by input and summed across ranks, the module's head counts divided; expert stacks
(SwitchGLU / SwitchMLP) split in place. A module whose roles are not all known (fused qkv,
low-rank attention), or whose forward no longer builds once split, stays replicated: slower,
never wrong. docs/sharding.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx
from mlx import nn
from mlx.nn.layers.distributed import shard_inplace, shard_linear

from exod.runner.split import shapes
from exod.runner.split.blocks import Blocks

COLUMN = frozenset({"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "w1", "w3", "wq",
                    "wk", "wv", "query", "key", "value", "fc1", "c_fc", "c_fc_0", "c_fc_1",
                    "gate_up_proj"})
ROW = frozenset({"o_proj", "down_proj", "w2", "wo", "out_proj", "fc2", "c_proj", "dense"})
SEGMENTS = {"gate_up_proj": 2}  # fused projections whose halves are split separately
HEADS = ("n_heads", "num_heads", "n_head", "num_attention_heads", "n_kv_heads", "num_kv_heads",
         "num_key_value_heads", "n_kv_head")
KV_HEADS = frozenset({"n_kv_heads", "num_kv_heads", "num_key_value_heads", "n_kv_head"})
EXPERTS = frozenset({"SwitchGLU", "SwitchMLP"})
EXPERT_COLUMN = ("gate_proj", "up_proj", "fc1")
EXPERT_ROW = ("down_proj", "fc2")


class CannotShard(Exception):
    """This model cannot be split across this many ranks (the reason is the message, in words
    a user understands)."""


def block_sharder(model: nn.Module, blocks: Blocks, group: Any) -> Callable[[nn.Module], None]:
    """Shard one block (call it on each block before evaluating it). A family's own shard()
    runs here, at once, on the still unevaluated model; its per-block part is then a no-op."""
    _check_heads(blocks, group.size())
    if callable(getattr(model, "shard", None)):
        model.shard(group)
        return lambda block: None
    return lambda block: shard_block(block, group)


def heads_problem(module: nn.Module, name: str, value: int, n: int) -> CannotShard:
    kind = "key/value heads" if name in KV_HEADS else "attention heads"
    return CannotShard(f"its {value} {kind} do not split across {n} ranks "
                       f"({type(module).__name__}.{name} = {value})")


def _check_heads(blocks: Blocks, n: int) -> None:
    """Head counts must split evenly: a family's own shard() divides them without checking."""
    for block in blocks.items[:1]:  # blocks of one model share their attention's shape
        for _, m in block.named_modules():
            for h in HEADS:
                value = getattr(m, h, None)
                if isinstance(value, int) and not isinstance(value, bool) and value % n:
                    raise heads_problem(m, h, value, n)


def shard_block(block: nn.Module, group: Any) -> None:
    """Shard every module of one block whose projection roles are known."""
    n = group.size()
    for _, parent in block.named_modules():
        linears: dict[str, nn.Module] = {k: v for k, v in parent.items()
                   if isinstance(v, (nn.Linear, nn.QuantizedLinear))}
        if linears:
            _shard_dense(parent, linears, n, group)
        if type(parent).__name__ in EXPERTS:
            _shard_experts(parent, group)


def _shard_dense(parent: nn.Module, linears: dict[str, nn.Module], n: int, group: Any) -> None:
    cols = [k for k in linears if k in COLUMN]
    rows = [k for k in linears if k in ROW]
    # A name alone can mislead: qwen's w2 feeds the gate where llama's w2 is the down
    # projection. One that takes the module's input width and gives out another fans out.
    width = {_in_dim(linears[k]) for k in cols}
    for k in list(rows):
        if width == {_in_dim(linears[k])} and _out_dim(linears[k]) not in width:
            rows.remove(k)
            cols.append(k)
    if not cols or not rows or set(linears) - COLUMN - ROW:
        return
    outs = {_out_dim(linears[k]) for k in cols}
    for child in parent.values():
        w = getattr(child, "weight", None)
        if isinstance(child, (nn.RMSNorm, nn.LayerNorm)) and w is not None and w.shape[-1] in outs:
            return  # normalises a whole projection: needs every rank's part
    heads = {h: getattr(parent, h) for h in HEADS if isinstance(getattr(parent, h, None), int)}
    for name, value in heads.items():
        if value % n:
            raise heads_problem(parent, name, value, n)
    for k in cols:
        seg = SEGMENTS.get(k, 1)
        if _out_dim(linears[k]) % (n * seg):
            raise CannotShard(f"the {_out_dim(linears[k])} outputs of its {k} projection do "
                              f"not split across {n} ranks")
    for k in rows:
        if any(a.shape[-1] % n for a in _arrays(linears[k])):
            raise CannotShard(f"the inputs of its {k} projection do not split across {n} "
                              "ranks")
    if not shapes.still_builds(parent, linears, cols, rows, heads, n):
        return  # e.g. reshapes its output to the full width: stays whole
    for k in cols:
        setattr(parent, k, shard_linear(linears[k], "all-to-sharded",
                                        segments=SEGMENTS.get(k, 1), group=group))
    for k in rows:
        setattr(parent, k, shard_linear(linears[k], "sharded-to-all", group=group))
    _split_per_head(parent, set(heads.values()), n, group.rank())
    for name, value in heads.items():
        setattr(parent, name, value // n)


def _split_per_head(parent: nn.Module, counts: set[int], n: int, rank: int) -> None:
    """Arrays the module keeps one row per head of (attention sinks, per-head scales): each
    rank keeps the rows of its own heads."""
    for key, value in list(parent.items()):
        if isinstance(value, mx.array) and value.ndim >= 1 and value.shape[0] in counts:
            part = value.shape[0] // n
            parent[key] = value[rank * part:(rank + 1) * part]


def _shard_experts(parent: nn.Module, group: Any) -> None:
    n = group.size()
    for k in EXPERT_COLUMN:
        if k in parent:
            shard_inplace(parent[k], "all-to-sharded", group=group)
    for k in EXPERT_ROW:
        if k in parent:
            proj = parent[k]
            if any(a.shape[-1] % n for a in _arrays(proj)):
                raise CannotShard(f"the inputs of its experts' {k} projection do not split "
                                  f"across {n} ranks")
            shard_inplace(proj, "sharded-to-all", group=group)
            if "bias" in proj:  # summed over the ranks below: each adds its share
                proj.bias = proj.bias / n
    base = type(parent)

    def __call__(self: nn.Module, *args: Any, **kwargs: Any) -> mx.array:
        return mx.distributed.all_sum(base.__call__(self, *args, **kwargs),
                                      group=self.exod_group)

    parent.exod_group = group  # an attribute, not a closure: the probe swaps in its own group
    parent.__class__ = type(f"Sharded{base.__name__}", (base,), {"__call__": __call__})


def _out_dim(linear: nn.Module) -> int:
    return int(linear["weight"].shape[0])


def _in_dim(linear: nn.Module) -> int:
    """Input width of a linear layer, quantized or not (packed weights keep `bits` per 32)."""
    w = linear["weight"]
    bits = getattr(linear, "bits", None)
    return int(w.shape[-1] * 32 // bits) if isinstance(linear, nn.QuantizedLinear) and bits \
        else int(w.shape[-1])


def _arrays(module: nn.Module) -> list[mx.array]:
    return [v for v in module.values() if isinstance(v, mx.array)]
