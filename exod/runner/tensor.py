"""Tensor parallelism for any family built from linear projections, one block at a time.

A family's own `shard(group)` is used where mlx-lm has one. Elsewhere each block is sharded by
projection role with mlx's distributed layers: within a module that has both roles, the
projections that fan out (q/k/v, gate/up, ...) are split by output ("all-to-sharded") and those
that fan back in (o, down, ...) by input ("sharded-to-all", which sums across ranks), and the
module's head counts are divided by the number of ranks. Expert stacks (mlx-lm's SwitchGLU /
SwitchMLP) are split in place and their output summed across ranks. A module whose roles are
not all known (fused qkv, low-rank attention, a norm over the full projection) stays
replicated: slower, never wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx
from mlx import nn
from mlx.nn.layers.distributed import shard_inplace, shard_linear
from mlx.utils import tree_unflatten

from exod.runner.blocks import Blocks, flat_arrays

COLUMN = frozenset({"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "w1", "w3", "wq",
                    "wk", "wv", "query", "key", "value", "fc1", "c_fc", "gate_up_proj"})
ROW = frozenset({"o_proj", "down_proj", "w2", "wo", "out_proj", "fc2", "c_proj", "dense"})
SEGMENTS = {"gate_up_proj": 2}  # fused projections whose halves are split separately
HEADS = ("n_heads", "num_heads", "n_head", "num_attention_heads", "n_kv_heads", "num_kv_heads",
         "num_key_value_heads", "n_kv_head")
EXPERTS = frozenset({"SwitchGLU", "SwitchMLP"})
EXPERT_COLUMN = ("gate_proj", "up_proj", "fc1")
EXPERT_ROW = ("down_proj", "fc2")


class CannotShard(Exception):
    """This model cannot be split across this many ranks (the reason is the message)."""


def block_sharder(model: nn.Module, blocks: Blocks,
                  group: Any) -> tuple[Callable[[nn.Module], None], Callable[[], None]]:
    """(shard one block, finish): `finish` runs once after every block, for a family shard()
    that also touches what lies outside the blocks."""
    _check_heads(blocks, group.size())
    own = _family_sharder(model, blocks, group)
    if own is not None:
        return own
    return (lambda block: shard_block(block, group)), (lambda: None)


def _check_heads(blocks: Blocks, n: int) -> None:
    """Head counts must split evenly: a family's own shard() divides them without checking."""
    for block in blocks.items[:1]:  # blocks of one model share their attention's shape
        for _, m in block.named_modules():
            for h in HEADS:
                value = getattr(m, h, None)
                if isinstance(value, int) and not isinstance(value, bool) and value % n:
                    raise CannotShard(f"{type(m).__name__}.{h} is {value}, "
                                      f"not divisible by {n} ranks")


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
            raise CannotShard(f"{type(parent).__name__}.{name} is {value}, "
                              f"not divisible by {n} ranks")
    head_dim = getattr(parent, "head_dim", None)
    for k in cols:
        out = _out_dim(linears[k])
        if isinstance(head_dim, int) and head_dim > 0 and out % head_dim == 0 \
                and (out // head_dim) % n:
            # a single key/value head kept by no attribute (recurrent_gemma's k_proj)
            raise CannotShard(f"{type(parent).__name__}.{k} gives {out // head_dim} head(s) "
                              f"of {head_dim}, not divisible by {n} ranks")
    for k in cols:
        seg = SEGMENTS.get(k, 1)
        if _out_dim(linears[k]) % (n * seg):
            raise CannotShard(f"{k} has {_out_dim(linears[k])} outputs, "
                              f"not divisible by {n} ranks")
        setattr(parent, k, shard_linear(linears[k], "all-to-sharded", segments=seg, group=group))
    for k in rows:
        if any(a.shape[-1] % n for a in _arrays(linears[k])):
            raise CannotShard(f"{k}'s input is not divisible by {n} ranks")
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
                raise CannotShard(f"experts' {k} input is not divisible by {n} ranks")
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


def _family_sharder(model: nn.Module, blocks: Blocks, group: Any
                    ) -> tuple[Callable[[nn.Module], None], Callable[[], None]] | None:
    """The family's own shard(), one block at a time when it touches nothing but the blocks
    (checked by running it on an empty list first), else all at once at the end."""
    if not callable(getattr(model, "shard", None)):
        return None
    everything = list(blocks.items)
    params = _flat(model)
    before = {k: id(v) for k, v in params}
    modules = model.leaf_modules()
    blocks.owner[blocks.key] = []
    try:
        model.shard(group)
        after = {k: id(v) for k, v in _flat(model)}
    finally:
        blocks.owner[blocks.key] = everything
    if after != {k: v for k, v in before.items() if f".{blocks.key}." not in f".{k}"}:
        # It shards more than the blocks: undo the trial, then shard everything at the end.
        model.update_modules(modules)
        model.update(tree_unflatten(params))
        return (lambda block: None), (lambda: model.shard(group))

    def one(block: nn.Module) -> None:
        blocks.owner[blocks.key] = [block]
        try:
            model.shard(group)
        finally:
            blocks.owner[blocks.key] = everything

    return one, (lambda: None)


def _flat(model: nn.Module) -> list[tuple[str, mx.array]]:
    return flat_arrays(model.parameters())
