"""Would a module's forward still build once its projections are split by role?

Some families reshape an attention's output to the width of the block's input (`reshape(B, L,
D)` with D the hidden size) rather than to heads × head width: split by role, that module's
forward no longer builds, while the rest of the block would split fine. mlx checks shapes as it
builds a graph, so the module's own forward answers: called on a lazy input, first with
stand-ins of its projections at full size, then at their split size (heads divided too),
nothing evaluated and no weight touched. A module whose forward cannot be called that way (it
needs arguments we cannot make up) gives no answer, and is split as before.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import mlx.core as mx
from mlx import nn


class _Shape(nn.Module):
    """A projection's shape alone: checks its input's width and returns its output's."""

    def __init__(self, inputs: int, outputs: int) -> None:
        super().__init__()
        self.inputs, self.outputs = inputs, outputs

    def __call__(self, x: mx.array) -> mx.array:
        if x.shape[-1] != self.inputs:
            raise ValueError(f"a projection of {self.inputs} inputs given {x.shape[-1]}")
        return mx.zeros((*x.shape[:-1], self.outputs), dtype=x.dtype)


def in_dim(linear: nn.Module) -> int:
    bits = getattr(linear, "bits", None)
    width = int(linear["weight"].shape[-1])
    return width * 32 // int(bits) if isinstance(linear, nn.QuantizedLinear) and bits else width


def still_builds(parent: nn.Module, linears: dict[str, nn.Module], cols: list[str],
                 rows: list[str], heads: dict[str, int], n: int) -> bool:
    """False only when the forward builds with full-size projections and fails split."""
    dims = {k: (in_dim(v), int(v["weight"].shape[0])) for k, v in linears.items()}
    width = dims[cols[0]][0]
    whole = {k: _Shape(*d) for k, d in dims.items()}
    split = {**{k: _Shape(dims[k][0], dims[k][1] // n) for k in cols},
             **{k: _Shape(dims[k][0] // n, dims[k][1]) for k in rows}}
    try:
        if not _builds(parent, whole, {}, width):
            return True  # no answer: split it as before
        return _builds(parent, split, {h: v // n for h, v in heads.items()}, width)
    finally:
        for k, v in linears.items():
            setattr(parent, k, v)


def _builds(parent: nn.Module,
            stand_ins: Mapping[str, nn.Module], heads: dict[str, int], width: int) -> bool:
    saved = {h: getattr(parent, h) for h in heads}
    for k, module in stand_ins.items():
        setattr(parent, k, module)
    for h, count in heads.items():
        setattr(parent, h, count)
    try:
        parent(*_arguments(parent, mx.zeros((1, 2, width))))
    except Exception:  # noqa: BLE001 -- any failure to build is the answer
        return False
    finally:
        for h, old in saved.items():
            setattr(parent, h, old)
    return True


def _arguments(parent: nn.Module, x: mx.array) -> list[Any]:
    """x, then None for every other argument the forward requires (mask, cache, ...)."""
    try:
        params = list(inspect.signature(type(parent).__call__).parameters.values())[1:]
    except (TypeError, ValueError):
        return [x]
    required = [p for p in params if p.default is inspect.Parameter.empty
                and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return [x] + [None] * (len(required) - 1)
