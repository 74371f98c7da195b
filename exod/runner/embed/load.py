"""Load an embedding model or a reranker as the other runners load theirs: lazily first
(mlx-vlm's encoder loader reads the files' headers and names the module tree), then what lies
outside the blocks and one block at a time (exod.runner.load.evaluate_whole), with progress
after each and no timer anywhere. The tokenizer is transformers' own, as sentence-transformers
and mlx-vlm's server use it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exod.facts.embed import Encoding
from exod.runner.failures import ModelError
from exod.runner.load import evaluate_whole


@dataclass
class LoadedEncoder:
    model: Any  # the family's mlx-vlm model (Model, or SequenceClassificationModel)
    tokenizer: Any  # transformers' tokenizer of the model
    encoding: Encoding
    dtype: str
    seconds: float
    layers: int


def load_encoder(path: Path, enc: Encoding, *, dtype: str,
                 progress: Callable[[int, int], None],
                 should_stop: Callable[[], bool]) -> LoadedEncoder:
    """ModelError for a directory mlx-vlm cannot load; LoadAborted when asked to stop."""
    from transformers import AutoTokenizer

    t0 = time.monotonic()
    try:
        if enc.role == "rerank":
            from mlx_vlm.reranker_loader import load_sequence_classification_model

            model = load_sequence_classification_model(path, lazy=True)
        else:
            from mlx_vlm.embedding_loader import load_embedding_model

            model = load_embedding_model(path, lazy=True)
            # The Pooling module's mode, read where mlx-vlm's server reads it; None leaves the
            # family's own default.
            model.pooling_config = enc.pooling
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    except Exception as e:  # mlx-vlm and transformers raise many types for a bad directory
        raise ModelError(f"{type(e).__name__}: {e}") from e
    dt, n = evaluate_whole(model, dtype, progress, should_stop)
    return LoadedEncoder(model, tokenizer, enc, dt, time.monotonic() - t0, n)
