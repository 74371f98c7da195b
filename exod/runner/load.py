"""Load a model shard layer by layer, with progress and no timeout.

Lazy load first (reads only the file headers), then keep only this rank's layers, then evaluate
the non-layer weights and every owned layer one at a time, reporting after each. Layers outside
[start, end) are dropped before any evaluation, so they are never read from disk. No timer is
involved anywhere: a slow disk makes this slow, never fatal.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from exod.core.shards import Shard

DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}


class LoadAborted(Exception):
    """The runner was asked to stop while loading."""


class ModelError(Exception):
    """This model cannot be loaded by this runner (retrying will not help)."""


@dataclass
class Loaded:
    model: nn.Module
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
) -> Loaded:
    from mlx_lm.utils import load  # heavy (imports transformers): only here, only in the runner

    t0 = time.monotonic()
    try:
        model, tokenizer = load(str(path), lazy=True)
    except Exception as e:  # mlx-lm raises many types for a bad model directory
        raise ModelError(f"{type(e).__name__}: {e}") from e

    total = len(model.layers)
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
    in_layers = {id(a) for layer in layers for _, a in tree_flatten(layer.parameters())}
    rest = [a for _, a in tree_flatten(model.parameters()) if id(a) not in in_layers]
    n = len(layers)
    progress(0, n)
    try:
        mx.eval(rest)  # embeddings, final norm, head
        for i, layer in enumerate(layers, 1):
            if should_stop():
                raise LoadAborted()
            mx.eval(layer.parameters())
            progress(i, n)
    except (LoadAborted, KeyboardInterrupt):
        raise
    except Exception as e:  # a truncated or corrupt safetensors file surfaces here, at eval
        raise ModelError(f"{type(e).__name__}: {e}") from e
    return Loaded(model, tokenizer, shard, dt, time.monotonic() - t0)
