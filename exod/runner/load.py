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

from exod.core.shards import Shard
from exod.runner.split import pipeline
from exod.runner.split.blocks import Blocks, NoBlocks, find_blocks, flat_arrays
from exod.runner.split.pipeline import Link
from exod.runner.split.tensor import CannotShard, block_sharder

DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}


class LoadAborted(Exception):
    """The runner was asked to stop while loading."""


class ModelError(Exception):
    """This model cannot be loaded by this runner (retrying will not help)."""


@dataclass
class Loaded:
    # Any, not nn.Module: a family's model class, whatever it derives from.
    model: Any
    tokenizer: Any
    shard: Shard
    dtype: str
    seconds: float
    link: Link | None = None  # a pipeline rank's connections to its neighbours
    parallelism: str = "pipeline"


def resolve_dtype(name: str) -> str:
    """`auto` is float32 on CPU (bf16/fp16 matmuls skip BLAS there) and the file's dtype on GPU."""
    if name != "auto":
        return name
    return "float32" if mx.default_device() == mx.cpu else "keep"


def load_shard(
    path: Path,
    shard: Shard,
    *,
    parallelism: str = "pipeline",
    dtype: str = "auto",
    progress: Callable[[int, int], None],
    should_stop: Callable[[], bool],
    group: Any = None,
    adapters: Path | None = None,
) -> Loaded:
    """`group` (an mx.distributed.Group) is needed for tensor parallelism, to shard.
    `adapters`: a LoRA adapter folder, applied as mlx-lm's load applies it (adapter_path)."""
    from mlx_lm.utils import load  # heavy (imports transformers): only here, only in the runner

    t0 = time.monotonic()
    try:
        # Without return_config, load returns (model, tokenizer); its type admits a 3-tuple.
        model, tokenizer = cast("tuple[nn.Module, Any]", load(
            str(path), lazy=True, adapter_path=str(adapters) if adapters else None))
    except Exception as e:  # mlx-lm raises many types for a bad model directory
        what = "adapters: " if adapters and "adapter" in str(e).lower() else ""
        raise ModelError(f"{what}{type(e).__name__}: {e}") from e

    try:
        blocks = find_blocks(model)
    except NoBlocks as e:
        if shard.world > 1:
            raise ModelError(f"{e}: it cannot be split across ranks") from e
        blocks = None
    total = len(blocks.items) if blocks is not None else shard.total
    if shard.total == 0:  # the daemon could not count the layers: this rank takes them all
        shard = Shard(shard.rank, shard.world, 0, total, total)
    if shard.total != total:
        raise ModelError(f"the model has {total} layers, the shard plan assumed {shard.total}")
    link = None
    if blocks is not None and parallelism == "pipeline" and shard.world > 1:
        link = Link(group, shard.rank, shard.world) if group is not None else None
        pipeline.install(blocks, shard, link)  # before any eval: other ranks' blocks stay unread

    dt = resolve_dtype(dtype)
    if dt != "keep":
        # Lazy: the cast happens as each layer is evaluated, so memory never holds both copies.
        model.set_dtype(DTYPES[dt])

    evaluate_weights(model, blocks, shard, parallelism, group, progress, should_stop)
    return Loaded(model, tokenizer, shard, dt, time.monotonic() - t0, link, parallelism)


def evaluate_whole(model: nn.Module, dtype: str, progress: Callable[[int, int], None],
                   should_stop: Callable[[], bool]) -> tuple[str, int]:
    """A lazily loaded model of one rank (the vision and embedding runners' mlx-vlm models):
    cast to `dtype` as each weight is read, its blocks evaluated one at a time with progress.
    (the dtype it runs in, its number of blocks)."""
    try:
        blocks: Blocks | None = find_blocks(model)
    except NoBlocks:
        blocks = None
    n = len(blocks.items) if blocks is not None else 0
    dt = resolve_dtype(dtype)
    if dt != "keep":
        model.set_dtype(DTYPES[dt])  # lazily: each weight is cast as it is read
    evaluate_weights(model, blocks, Shard(0, 1, 0, n, n), "pipeline", None, progress,
                     should_stop)
    return dt, n


def evaluate_weights(model: nn.Module, blocks: Blocks | None, shard: Shard, parallelism: str,
              group: Any, progress: Callable[[int, int], None],
              should_stop: Callable[[], bool]) -> None:
    """Read (and for tensor parallelism, shard) the weights this rank keeps: what lies outside
    the blocks first, then one owned block at a time, reporting progress after each."""
    owned = ([] if blocks is None else
             [b for b in blocks.items if not pipeline.is_stand_in(b)])
    n = len(owned)
    progress(0, n)
    try:
        # Sharding slices the lazily loaded weights: evaluating a block then reads its weights
        # and keeps only this rank's part, one block at a time.
        shard_one = (block_sharder(model, blocks, group)
                     if parallelism == "tensor" and blocks is not None and shard.world > 1
                     else None)
        mx.eval(_outside_blocks(model, [] if blocks is None else blocks.items, shard,
                                parallelism))
        for i, layer in enumerate(owned, 1):
            if should_stop():
                raise LoadAborted()
            if shard_one is not None:
                shard_one(layer)
            mx.eval(layer.parameters())
            progress(i, n)
        if blocks is None:
            mx.eval(model.parameters())
    except (LoadAborted, KeyboardInterrupt):
        raise
    except CannotShard as e:
        raise ModelError(f"tensor parallelism: {e}") from e
    except Exception as e:  # a truncated or corrupt safetensors file surfaces here, at eval
        raise ModelError(f"{type(e).__name__}: {e}") from e


def _outside_blocks(model: nn.Module, blocks: list[nn.Module], shard: Shard,
                    parallelism: str) -> list[mx.array]:
    """Weights outside the blocks, evaluated up front. Not for a pipeline rank: which of them
    it uses (the first rank embeds, the last one projects) is whatever its forward evaluates,
    so they are read at the first token and the rest are never read from disk."""
    if parallelism == "pipeline" and shard.world > 1:
        return []
    in_blocks = {id(a) for block in blocks for _, a in flat_arrays(block.parameters())}
    return [a for _, a in flat_arrays(model.parameters()) if id(a) not in in_blocks]


def load_draft(path: Path, dtype: str) -> Any:
    """The draft model of speculative decoding, whole, in the dtype the model runs in (the two
    meet in one generate loop). Its tokenizer is the model's: only its vocabulary size counts."""
    from mlx_lm.utils import load

    try:
        model, _ = cast("tuple[nn.Module, Any]", load(str(path), lazy=True))
        if dtype != "keep":
            model.set_dtype(DTYPES[dtype])
        mx.eval(model.parameters())
    except Exception as e:  # as load_shard: a bad directory or weights surface as many types
        raise ModelError(f"draft_model {path}: {type(e).__name__}: {e}") from e
    return model
