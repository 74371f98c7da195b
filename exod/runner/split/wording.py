"""A probe's failure in words a user understands, with the raw error kept as a detail.

The probe's own refusals (no list of layers, heads that do not split) are already worded. What
mlx or a family's forward raises on a split it cannot take (`[reshape] Cannot reshape array of
size 96 into shape (1,3,64)`) says nothing to someone choosing a layout: it is translated into
what went wrong, and where in the family's code.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from pathlib import Path

# mlx's shape errors start with the operation in brackets: what each means for a split model.
_OPERATIONS = {
    "reshape": "the model's code reshapes a split projection to a width only the whole "
               "model has",
    "broadcast_shapes": "the model's code combines a split part with one that is not split",
    "matmul": "the model's code multiplies a split part with one that is not split",
    "addmm": "the model's code multiplies a split part with one that is not split",
    "concatenate": "the model's code joins a split part with one that is not split",
    "split": "the model's code splits a projection the split already made narrower",
}
_WORDED = ("NoBlocks", "CannotShard", "ProbeError")


@dataclass(frozen=True)
class Explained:
    reason: str  # for a user
    detail: str | None  # the raw error, for a bug report


def explain(e: BaseException, parallelism: str) -> Explained:
    raw = " ".join(str(e).split())
    name = type(e).__name__
    if name == "NoBlocks":
        return Explained("the model has no list of layers to divide among ranks", raw)
    if name in _WORDED:
        return Explained(raw, None)
    where = _where(e)
    at = f" (at {where})" if where else ""
    detail = f"{name}: {raw}"
    if raw and _in_shard(e):  # mlx-lm's checks there are already worded
        return Explained(f"mlx-lm's own sharding of this family refuses it: {raw}{at}", None)
    op = raw[1:raw.index("]")] if raw.startswith("[") and "]" in raw else None
    if op in _OPERATIONS:
        return Explained(f"{_OPERATIONS[op]}{at}", detail)
    what = "split across ranks" if parallelism == "tensor" else "divided into layer ranges"
    return Explained(f"the model's forward fails once {what}{at}", detail)


def _frames(e: BaseException) -> list[traceback.FrameSummary]:
    return list(traceback.extract_tb(e.__traceback__))


def _where(e: BaseException) -> str | None:
    """The innermost line of mlx-lm's model code in the traceback: `qwen3.py:74 in Attention`."""
    for frame in reversed(_frames(e)):
        path = Path(frame.filename)
        if path.parent.name == "models" and path.parent.parent.name == "mlx_lm":
            return f"mlx_lm/models/{path.name}:{frame.lineno}, in {frame.name}"
    return None


def _in_shard(e: BaseException) -> bool:
    return any(f.name == "shard" for f in _frames(e))
