"""Load a model shard layer by layer, with progress and no timeout.

Lazy load first (reads only the file headers), then keep only this rank's layers, then evaluate
the non-layer weights and every owned layer one at a time, reporting after each. Layers outside
[start, end) are dropped before any evaluation, so they are never read from disk. No timer is
involved anywhere: a slow disk makes this slow, never fatal.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
from mlx import nn
from mlx.utils import tree_flatten

from exod.core.shards import Shard

DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}


class LoadAborted(Exception):
    """The runner was asked to stop while loading."""


class ModelError(Exception):
    """This model cannot be loaded by this runner (retrying will not help)."""


@dataclass
class Loaded:
    # Any, not nn.Module: rank 0 of a group serves through parallel.LeaderModel, a stand-in
    # for the model that drives the whole group.
    model: Any
    tokenizer: Any
    shard: Shard
    dtype: str
    seconds: float


def resolve_dtype(name: str) -> str:
    """`auto` is float32 on CPU (bf16/fp16 matmuls skip BLAS there) and the file's dtype on GPU."""
    if name != "auto":
        return name
    return "float32" if mx.default_device() == mx.cpu else "keep"


def find_layers_owner(model: nn.Module) -> nn.Module:
    """The module whose `layers` attribute is the list of transformer blocks.

    mlx-lm models expose `model.layers` (often a property forwarding to `model.model.layers`);
    to drop layers we must assign on the module that really owns the list.
    """
    target = getattr(model, "layers", None)
    if not isinstance(target, list):
        raise ModelError(f"{type(model).__module__} has no `layers` list: cannot split it")
    stack: list[nn.Module] = [model]
    while stack:
        m = stack.pop()  # nn.Module is a dict of its children
        if m.get("layers") is target:
            return m
        stack.extend(v for v in m.values() if isinstance(v, nn.Module))
    raise ModelError("could not find the module that owns `layers`")


def load_shard(
    path: Path,
    shard: Shard,
    *,
    parallelism: str = "pipeline",
    dtype: str = "auto",
    progress: Callable[[int, int], None],
    should_stop: Callable[[], bool],
    group: Any = None,
) -> Loaded:
    """`group` (an mx.distributed.Group) is needed for tensor parallelism, to shard."""
    from mlx_lm.utils import load  # heavy (imports transformers): only here, only in the runner

    t0 = time.monotonic()
    try:
        # Without return_config, load returns (model, tokenizer); its type admits a 3-tuple.
        model, tokenizer = cast("tuple[nn.Module, Any]", load(str(path), lazy=True))
    except Exception as e:  # mlx-lm raises many types for a bad model directory
        raise ModelError(f"{type(e).__name__}: {e}") from e

    total = len(model.layers)
    if shard.total == 0:  # the daemon could not count the layers: this rank takes them all
        shard = Shard(shard.rank, shard.world, 0, total, total)
    if shard.total != total:
        raise ModelError(f"the model has {total} layers, the shard plan assumed {shard.total}")
    owner = find_layers_owner(model)
    if parallelism == "pipeline" and (shard.start, shard.end) != (0, total):
        owner.layers = owner.layers[shard.start : shard.end]  # before any eval: never read

    dt = resolve_dtype(dtype)
    if dt != "keep":
        # Lazy: the cast happens as each layer is evaluated, so memory never holds both copies.
        model.set_dtype(DTYPES[dt])

    layers: list[nn.Module] = list(owner.layers)
    shard_layer = _layer_sharder(model, owner, group) if parallelism == "tensor" else None
    n = len(layers)
    progress(0, n)
    try:
        mx.eval(_needed_outside_layers(model, layers, shard, parallelism))
        for i, layer in enumerate(layers, 1):
            if should_stop():
                raise LoadAborted()
            mx.eval(layer.parameters())
            if shard_layer is not None:
                shard_layer(layer)
            progress(i, n)
        if parallelism == "tensor" and shard_layer is None:
            model.shard(group)  # this family's shard() touches more than the layers: at once
            mx.eval(model.parameters())
    except (LoadAborted, KeyboardInterrupt):
        raise
    except Exception as e:  # a truncated or corrupt safetensors file surfaces here, at eval
        raise ModelError(f"{type(e).__name__}: {e}") from e
    return Loaded(model, tokenizer, shard, dt, time.monotonic() - t0)


def flat_arrays(tree: Any) -> list[tuple[str, mx.array]]:
    """tree_flatten of a parameter tree, typed: mlx types the result as a list or a dict (the
    dict only when given one as `destination`)."""
    return cast("list[tuple[str, mx.array]]", tree_flatten(tree))


def _needed_outside_layers(model: nn.Module, layers: list[nn.Module], shard: Shard,
                           parallelism: str) -> list[mx.array]:
    """Non-layer weights this rank uses. In a pipeline the first rank embeds and the last one
    projects (and embeds too when the head is tied to the embeddings); the large matrices a
    rank does not use stay lazy, so they are never read from disk."""
    in_layers = {id(a) for layer in layers for _, a in flat_arrays(layer.parameters())}
    out = []
    tied = bool(getattr(getattr(model, "args", None), "tie_word_embeddings", False))
    for name, a in flat_arrays(model.parameters()):
        if id(a) in in_layers:
            continue
        if parallelism == "pipeline" and shard.world > 1:
            if "embed_tokens" in name and not (shard.first or (shard.last and tied)):
                continue
            if name.startswith("lm_head") and not shard.last:
                continue
        out.append(a)
    return out


def _layer_sharder(model: nn.Module, owner: nn.Module,
                   group: Any) -> Callable[[nn.Module], None] | None:
    """Tensor parallelism one layer at a time, so memory holds one unsharded layer at most and
    progress stays per layer. mlx-lm's `shard(group)` loops over the layers; shown a list of
    one layer, it shards just that one. That holds only if shard() touches nothing but the
    layers: checked by running it on an empty list first. Else None (shard all at the end)."""
    if not callable(getattr(model, "shard", None)):
        raise ModelError(f"{type(model).__module__} has no shard(): no tensor parallelism")
    everything = owner.layers
    before = {k: id(v) for k, v in flat_arrays(model.parameters())}
    owner.layers = []
    try:
        model.shard(group)
        after = {k: id(v) for k, v in flat_arrays(model.parameters())}
    finally:
        owner.layers = everything
    if after != {k: v for k, v in before.items() if ".layers." not in k}:
        return None

    def shard_one(layer: nn.Module) -> None:
        owner.layers = [layer]
        try:
            model.shard(group)
        finally:
            owner.layers = everything
        mx.eval(layer.parameters())

    return shard_one
