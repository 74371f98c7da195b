"""Load a text model's shard with mlx-lm, layer by layer, with progress and no timeout.

Lazy load first (reads only the file headers), then keep only this rank's layers, then evaluate
the non-layer weights and every owned layer one at a time (exod.runner.load), reporting after
each. Layers outside [start, end) are dropped before any evaluation, so they are never read from
disk. Also the draft model of speculative decoding.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
from mlx import nn

from exod.core.shards import Shard
from exod.runner.failures import ModelError
from exod.runner.load import DTYPES, Loaded, evaluate_weights, resolve_dtype
from exod.runner.split import pipeline
from exod.runner.split.blocks import NoBlocks, find_blocks
from exod.runner.split.pipeline import PipeLink


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
        link = PipeLink(group, shard.rank, shard.world) if group is not None else None
        pipeline.install(blocks, shard, link)  # before any eval: other ranks' blocks stay unread

    dt = resolve_dtype(dtype)
    if dt != "keep":
        # Lazy: the cast happens as each layer is evaluated, so memory never holds both copies.
        model.set_dtype(DTYPES[dt])

    evaluate_weights(model, blocks, shard, parallelism, group, progress, should_stop)
    return Loaded(model, tokenizer, shard, dt, time.monotonic() - t0, link, parallelism)



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
