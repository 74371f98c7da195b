"""Loading weights layer by layer, with progress and no timeout, for every kind of runner: the
dtype a model runs in, the loaded rank (`Loaded`), and the evaluation of its weights one block at
a time, reporting after each (a text rank's shard: exod.runner.text.load; a whole mlx-vlm model:
`evaluate_whole`). Layers outside a rank's range are never evaluated, so never read from disk.
No timer is involved anywhere: a slow disk makes this slow, never fatal.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx import nn

from exod.core.shards import Shard
from exod.runner.failures import LoadAborted, ModelError
from exod.runner.split import pipeline
from exod.runner.split.blocks import Blocks, NoBlocks, find_blocks, flat_arrays
from exod.runner.split.pipeline import PipeLink
from exod.runner.split.tensor import CannotShard, block_sharder

DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}


@dataclass
class Loaded:
    # Any, not nn.Module: a family's model class, whatever it derives from.
    model: Any
    tokenizer: Any
    shard: Shard
    dtype: str
    seconds: float
    link: PipeLink | None = None  # a pipeline rank's connections to its neighbours
    parallelism: str = "pipeline"


def resolve_dtype(name: str) -> str:
    """`auto` is float32 on CPU (bf16/fp16 matmuls skip BLAS there) and the file's dtype on GPU."""
    if name != "auto":
        return name
    return "float32" if mx.default_device() == mx.cpu else "keep"


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
