"""Load a model that sees, as the text runner loads one (exod.runner.load): lazily first (mlx-vlm
reads the files' headers, names and quantizes the module tree), then what lies outside the
language model's blocks (the vision tower, its projector, the embeddings and the head) and one
block at a time, with progress after each and no timer anywhere.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exod.core.shards import Shard
from exod.runner.load import DTYPES, ModelError, evaluate_weights, resolve_dtype
from exod.runner.split.blocks import NoBlocks, find_blocks


@dataclass
class LoadedVision:
    model: Any  # the family's mlx-vlm Model: vision tower, projector, language_model
    processor: Any  # its processor (the chat template, pictures into placeholders)
    tokenizer: Any  # mlx-lm's wrapper of the same tokenizer (detokenizer, markers)
    dtype: str
    seconds: float
    layers: int


def load_vision(path: Path, *, dtype: str, progress: Callable[[int, int], None],
                should_stop: Callable[[], bool]) -> LoadedVision:
    """ModelError for a directory mlx-vlm cannot load; LoadAborted when asked to stop."""
    from mlx_lm.utils import load_tokenizer
    from mlx_vlm.utils import load

    t0 = time.monotonic()
    try:
        model, processor = load(str(path), lazy=True)
        eos = getattr(model.config, "eos_token_id", None)
        tokenizer = load_tokenizer(path, eos_token_ids=eos)
    except Exception as e:  # mlx-vlm and transformers raise many types for a bad directory
        raise ModelError(f"{type(e).__name__}: {e}") from e
    try:
        blocks = find_blocks(model)
    except NoBlocks:
        blocks = None
    n = len(blocks.items) if blocks is not None else 0
    dt = resolve_dtype(dtype)
    if dt != "keep":
        model.set_dtype(DTYPES[dt])  # lazily: each weight is cast as it is read
    evaluate_weights(model, blocks, Shard(0, 1, 0, n, n), "pipeline", None, progress,
                     should_stop)
    return LoadedVision(model, processor, tokenizer, dt, time.monotonic() - t0, n)
