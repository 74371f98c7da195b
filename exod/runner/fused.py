"""On a CPU, mlx's normalisations and rotary embedding run fused during decode.

mlx has no CPU kernel for `mx.fast.rope`, `mx.fast.rms_norm` and `mx.fast.layer_norm`: there
each runs as its fallback, a chain of 5-20 primitive ops (positions, frequencies, cos, sin,
products, a concatenation...), every one of them dispatched and written out to memory on its
own. A decode step runs them two or three times per layer on a single position, where that
dispatch is most of their cost: 0.2 ms a rope where the layer's matmuls take ~1 ms (measured
on the demo model). `mx.compile` of the same fallback runs it as one fused kernel, with
bitwise-identical results (tests/integration/test_fused.py checks it for every dtype).

Only decode shapes are compiled (one position per sequence): mx.compile keeps an entry per
input shape, so prefill chunks of every length would pile up entries for little gain (their
matmuls dominate). Anything unusual (another stream, a missing weight) goes to mlx as it is.
On Metal these ops are native kernels: nothing is changed there. EXOD_FUSE=0 turns it off.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import mlx.core as mx

_STOCK: dict[str, Callable[..., mx.array]] = {}


def install() -> bool:
    """Route decode-shaped calls of mlx's fast rope and norms through compiled fallbacks on
    the CPU. True if installed (idempotent)."""
    if _STOCK:
        return True
    if mx.default_device() != mx.cpu or os.environ.get("EXOD_FUSE", "1") == "0":
        return False
    _STOCK.update(rope=mx.fast.rope, rms_norm=mx.fast.rms_norm, layer_norm=mx.fast.layer_norm)
    mx.fast.rope = _rope
    mx.fast.rms_norm = _rms_norm
    mx.fast.layer_norm = _layer_norm
    return True


def uninstall() -> None:
    """mlx's own functions back (for tests that compare the two)."""
    for name, fn in _STOCK.items():
        setattr(mx.fast, name, fn)
    _STOCK.clear()


# ---- the compiled fallbacks: Python numbers are constants of the compiled graph --------------
def _rope_base(x: mx.array, offset: mx.array, dims: int, traditional: bool, base: float,
               scale: float) -> mx.array:
    return _STOCK["rope"](x, dims, traditional=traditional, base=base, scale=scale,
                          offset=offset)


def _rope_freqs(x: mx.array, offset: mx.array, freqs: mx.array, dims: int, traditional: bool,
                scale: float) -> mx.array:
    return _STOCK["rope"](x, dims, traditional=traditional, base=None, scale=scale,
                          offset=offset, freqs=freqs)


def _rms(x: mx.array, weight: mx.array, eps: float) -> mx.array:
    return _STOCK["rms_norm"](x, weight, eps)


def _ln_wb(x: mx.array, w: mx.array, b: mx.array, eps: float) -> mx.array:
    return _STOCK["layer_norm"](x, w, b, eps)


def _ln_w(x: mx.array, w: mx.array, eps: float) -> mx.array:
    return _STOCK["layer_norm"](x, w, None, eps)


def _ln_b(x: mx.array, b: mx.array, eps: float) -> mx.array:
    return _STOCK["layer_norm"](x, None, b, eps)


def _ln_none(x: mx.array, eps: float) -> mx.array:
    return _STOCK["layer_norm"](x, None, None, eps)


_compiled_rope_base = mx.compile(_rope_base)
_compiled_rope_freqs = mx.compile(_rope_freqs)
_compiled_rms = mx.compile(_rms)
# One per combination of the parameters present (None is not an array input).
_compiled_ln: dict[tuple[bool, bool], Callable[..., mx.array]] = {
    (True, True): mx.compile(_ln_wb), (True, False): mx.compile(_ln_w),
    (False, True): mx.compile(_ln_b), (False, False): mx.compile(_ln_none)}


def _decoding(x: mx.array, axis: int) -> bool:
    """One position per sequence: the shapes of a decode step (a bounded set)."""
    return x.ndim >= 3 and x.shape[axis] == 1


# ---- what the model code calls: mlx's own signatures -------------------------------------------
def _rope(a: mx.array, dims: int, *, traditional: bool, base: float | None, scale: float,
          offset: int | mx.array, freqs: mx.array | None = None, stream: Any = None) -> mx.array:
    if stream is not None or not _decoding(a, -2) or (base is None) == (freqs is None):
        return _STOCK["rope"](a, dims, traditional=traditional, base=base, scale=scale,
                              offset=offset, freqs=freqs, stream=stream)
    # An array offset: an int would be a constant, compiled again at every position.
    off = offset if isinstance(offset, mx.array) else mx.array(offset, dtype=mx.int32)
    if freqs is not None:
        return _compiled_rope_freqs(a, off, freqs, dims, traditional, scale)
    return _compiled_rope_base(a, off, dims, traditional, float(base or 0.0), scale)


def _rms_norm(x: mx.array, weight: mx.array | None, eps: float, *,
              stream: Any = None) -> mx.array:
    if stream is not None or weight is None or not _decoding(x, 1):
        return _STOCK["rms_norm"](x, weight, eps, stream=stream)
    return _compiled_rms(x, weight, eps)


def _layer_norm(x: mx.array, weight: mx.array | None, bias: mx.array | None, eps: float, *,
                stream: Any = None) -> mx.array:
    if stream is not None or not _decoding(x, 1):
        return _STOCK["layer_norm"](x, weight, bias, eps, stream=stream)
    fn = _compiled_ln[(weight is not None, bias is not None)]
    return fn(x, *(p for p in (weight, bias) if p is not None), eps)
