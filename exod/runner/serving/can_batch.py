"""Whether mlx-lm's BatchGenerator can hold a model's caches.

A batch merges the caches of the requests that join it, filters them when requests leave and
extracts a finished request's cache for the prompt cache. A family whose cache type has no `merge`
(deepseek_v41's LayerCache), or whose forward leaves a cache empty (nemotron-nas makes one for a
layer whose attention is a linear map), cannot be batched: a single rank serves it one request at a
time (exod.runner.serving.turn_engine), and a group, whose ranks replay one batch engine in step,
cannot serve it at all (refused when it loads, before READY). So is a family whose attention
cannot take the mask of rows of different lengths (gemma2 and phi3small reshape their queries so
that the batch's padding mask no longer broadcasts; gpt_bigcode reads the offset as a number):
a trial step over rows of different lengths shows it, as its graph is built.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache


def unmergeable(model: Any) -> str | None:
    """Why the model's cache types cannot batch, or None; builds nothing."""
    kinds = sorted({type(c).__name__ for c in make_prompt_cache(model)
                    if not hasattr(c, "merge")})
    return f"mlx-lm cannot batch this model's caches ({', '.join(kinds)})" if kinds else None


def why_not(model: Any) -> str | None:
    """Why the model's caches cannot batch, or None. A trial forward is built (never
    evaluated: no weight is read) to see which caches it fills, so only for a whole model
    on one rank or in the probe, never on a rank whose forward talks to its peers."""
    why = unmergeable(model)
    if why is not None:
        return why
    caches = make_prompt_cache(model)
    try:
        model(mx.array([[1]], dtype=mx.int32), cache=caches)
    except Exception:  # noqa: BLE001 -- a model that cannot run fails its first token instead
        return None
    if any(getattr(c, "keys", True) is None for c in caches):
        return "the model leaves some of its caches empty, which mlx-lm's batch cannot hold"
    return _uneven_rows(model)


def _uneven_rows(model: Any) -> str | None:
    """Why a step over rows of different lengths fails, or None (graphs only). Three rows: a
    batch of two would pass where the padding mask broadcasts against 2 key/value heads."""
    rows = []
    for n in (1, 2, 3):
        caches = make_prompt_cache(model)
        model(mx.array([list(range(1, n + 1))], dtype=mx.int32), cache=caches)
        rows.append(caches)
    try:
        batch = [layer[0].merge(list(layer)) for layer in zip(*rows, strict=True)]
        model(mx.array([[1, 2]] * 3, dtype=mx.int32), cache=batch)  # a chunk of two tokens
    except Exception as e:  # noqa: BLE001 -- shape errors, conversions: the family cannot batch
        return (f"mlx-lm's batch cannot hold rows of different lengths for this model "
                f"({type(e).__name__}: {str(e)[:120]})")
    return None
