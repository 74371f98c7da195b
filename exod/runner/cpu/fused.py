"""On a CPU, mlx's normalisations and rotary embedding run fused during decode.

mlx has no CPU kernel for `mx.fast.rope`, `mx.fast.rms_norm` and `mx.fast.layer_norm`: each runs
as its fallback, a chain of small ops dispatched one by one, and on a decode step's one position
that dispatch is most of their cost. Here each is the same chain under `mx.compile`, with every
number that depends on the model (eps, 1/width, the rope's scale and frequency exponent) an input
array rather than a constant, so that one kernel serves every model of a dtype: mlx builds each
new kernel with the system's C++ compiler, and numbers baked in would build again per model and
after every service start (PrivateTmp). Only decode shapes go through here: mx.compile keeps an
entry per input shape, and prefill's matmuls dominate anyway.

Bitwise mlx's results: the first call of each kind computes both and keeps ours only if every
bit agrees; the patch is installed only on the mlx versions it was checked against
(`CHECKED_MLX`) and after a self-test, else a log line says why. EXOD_FUSE=0: off. docs/api.md,
"Fused rope and norms on a CPU"; docs/design/runner-cpu.md; `python -m bench fused`.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from typing import Any

import mlx.core as mx

from exod.runner.link.log import NOTICE, WARNING, log

# The chains below are mlx 0.32's fallbacks written out, and the wrappers take mx.fast's 0.32
# signatures: both were checked bit for bit on 0.32 only. Another minor release may compute
# otherwise or be called otherwise (pyproject accepts any mlx>=0.32), so outside this range
# mlx's own functions run until the chains are checked against it and the range is widened.
CHECKED_MLX = ((0, 32), (0, 33))  # lowest checked, first unchecked (major, minor)
F32 = mx.float32
_STOCK: dict[str, Callable[..., mx.array]] = {}
_VERDICT: dict[tuple[Any, ...], bool] = {}  # kind of call -> ours is bitwise mlx's
_NUMBERS: dict[tuple[float, Any], mx.array] = {}  # scalars as arrays, made once
_quiet = False  # during the self-test, whose failure is the one line logged


class SelfTestFailed(Exception):
    pass


def install() -> bool:
    """Route decode-shaped calls of mlx's fast rope and norms through the compiled chains on
    the CPU, if this mlx is one they were checked against and they pass the self-test. True
    if installed (idempotent)."""
    if _STOCK:
        return True
    if mx.default_device() != mx.cpu or os.environ.get("EXOD_FUSE", "1") == "0":
        return False
    unchecked = unchecked_version(str(getattr(mx, "__version__", "")))
    if unchecked:
        log(f"decode-step rope and norms not fused: {unchecked}", NOTICE)
        return False
    _STOCK.update(rope=mx.fast.rope, rms_norm=mx.fast.rms_norm, layer_norm=mx.fast.layer_norm)
    mx.fast.rope = _rope
    mx.fast.rms_norm = _rms_norm
    mx.fast.layer_norm = _layer_norm
    try:
        self_test()
    except Exception as e:  # noqa: BLE001 -- any failure means mlx's own functions, said once
        uninstall()
        log(f"decode-step rope and norms not fused: the self-test failed "
            f"({type(e).__name__}: {_first_line(e)}); mlx's own functions run", WARNING)
        return False
    return True


def install_note() -> str:
    """`install()`, said as the runner's "loaded" line says it ("" if not installed)."""
    return "; decode-step rope and norms fused (EXOD_FUSE=0: off)" if install() else ""


def unchecked_version(version: str) -> str:
    """Why the chains are not used with this mlx version ("" if it is in CHECKED_MLX)."""
    (lo_major, lo_minor), (hi_major, hi_minor) = CHECKED_MLX
    checked = f">={lo_major}.{lo_minor},<{hi_major}.{hi_minor}"
    found = re.match(r"(\d+)\.(\d+)", version)
    if found is None:
        return f"they were checked on mlx {checked}, and mlx's version {version!r} is unreadable"
    if not CHECKED_MLX[0] <= (int(found[1]), int(found[2])) < CHECKED_MLX[1]:
        return f"they were checked on mlx {checked}, this is mlx {version}"
    return ""


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else "no message"


def uninstall() -> None:
    """mlx's own functions back (tests compare the two)."""
    for name, fn in _STOCK.items():
        setattr(mx.fast, name, fn)
    _STOCK.clear()
    _VERDICT.clear()


def self_test() -> None:
    """Each patched function, called as model code calls it (through mlx's nn.RoPE, nn.RMSNorm
    and nn.LayerNorm, and directly in the forms mlx-lm's models write), must give mlx's own
    result bit for bit; raises on a difference, or whatever a call raises.

    It runs with mx.compile off: compiled, these calls made mlx build 12 kernels with the C++
    compiler (seconds of CPU at a cold start, which every service start is, with its private
    /tmp: docs/design/runner-cpu.md), of which a model's decode used 4. So this checks the
    signatures and the chains' arithmetic; the compiled kernels are still compared, kind by
    kind, at their first real call (its verdicts are dropped here so that they are)."""
    global _quiet
    _quiet = True
    mx.disable_compile()
    try:
        _compare_calls()
        differ = [kind for kind, agrees in _VERDICT.items() if not agrees]
        if differ or not _VERDICT:
            raise SelfTestFailed(f"{differ[0][0]} differs from mlx's own for {differ[0][1:]}"
                                 if differ else "no call took the fused path")
    finally:
        _quiet = False
        _VERDICT.clear()
        if "MLX_DISABLE_COMPILE" not in os.environ:  # set (to anything), mlx never compiles
            mx.enable_compile()


def _compare_calls() -> None:
    from mlx import nn

    key = mx.random.key(0)
    q = mx.random.normal((2, 2, 1, 8), key=key)  # batch, heads, one position, head dim
    h = mx.random.normal((2, 1, 8), key=key)  # batch, one position, hidden
    freqs = mx.exp(mx.arange(0, 2, dtype=F32))
    at: Any = mx.array(5)  # an offset array, as mlx-lm's caches pass (nn.RoPE says int)
    calls: list[tuple[str, mx.array, Callable[[mx.array], mx.array]]] = [
        ("rope", q, lambda x: nn.RoPE(8, base=10000.0)(x, offset=3)),
        ("rope", q, lambda x: nn.RoPE(8, traditional=True, scale=0.5)(x, offset=at)),
        ("rope", q, lambda x: mx.fast.rope(x, 4, traditional=False, base=None, scale=1.0,
                                           offset=mx.array([3, 7]), freqs=freqs)),
        ("rms_norm", h, lambda x: nn.RMSNorm(8, eps=1e-5)(x)),
        ("rms_norm", h, lambda x: mx.fast.rms_norm(x, None, 1e-6)),
        ("layer_norm", h, lambda x: nn.LayerNorm(8, eps=1e-5)(x)),
        ("layer_norm", h, lambda x: nn.LayerNorm(8, affine=False)(x)),
        ("layer_norm", h, lambda x: mx.fast.layer_norm(x, eps=1e-5, weight=None, bias=None)),
    ]
    for name, x, call in calls:
        _same(name, call, x)  # decode shape: the chains
        _same(name, call, mx.concatenate([x, x], axis=-2))  # prefill: mlx's own


def _same(name: str, call: Callable[[mx.array], mx.array], x: mx.array) -> None:
    """`call(x)` with the patch (twice: the first call of a decode kind compares, the second
    runs ours) and with mlx's own function put back, bit for bit the same."""
    ours = [call(x), call(x)]
    patched = getattr(mx.fast, name)
    setattr(mx.fast, name, _STOCK[name])
    try:
        theirs = call(x)
    finally:
        setattr(mx.fast, name, patched)
    mx.eval(ours, theirs)
    for got in ours:
        if not (got.dtype == theirs.dtype and got.shape == theirs.shape
                and bool(mx.array_equal(got, theirs, equal_nan=True).item())):
            raise SelfTestFailed(f"{name} differs from mlx's own for shape {got.shape}")


# ---- the chains of mlx's fallbacks (mlx 0.32), numbers as inputs ---------------------------
@mx.compile
def _rms_chain(x: mx.array, eps: mx.array, inv_n: mx.array, *weight: mx.array) -> mx.array:
    x32 = x.astype(F32)
    mean = mx.sum(mx.square(x32), axis=-1, keepdims=True) * inv_n
    y = (x32 * mx.rsqrt(mean + eps)).astype(x.dtype)
    return y * weight[0] if weight else y


@mx.compile
def _ln_chain(x: mx.array, eps: mx.array, inv_n: mx.array, *params: mx.array,
              has_weight: bool, has_bias: bool) -> mx.array:
    x32 = x.astype(F32)
    centred = x32 - mx.sum(x32, axis=-1, keepdims=True) * inv_n
    var = mx.sum(mx.square(centred), axis=-1, keepdims=True) * inv_n
    y = (centred * mx.rsqrt(var + eps)).astype(x.dtype)
    if has_weight:
        y = y * params[0]
    if has_bias:
        y = y + params[-1]
    return y


@mx.compile
def _rope_chain(x: mx.array, offset: mx.array, scale: mx.array, freq: mx.array, *,
                dims: int, traditional: bool, exponent: bool) -> mx.array:
    """`freq`: the exponent step log(base)/(dims/2) (`exponent`), else the given freqs."""
    half = dims // 2
    if offset.size > 1:  # one offset per sequence of the batch
        offset = offset.reshape(*offset.shape, 1, 1)
    positions = (mx.arange(x.shape[-2], dtype=F32) + offset.astype(F32)) * scale
    if exponent:
        inv_freqs = mx.exp(mx.arange(0, -half, -1, dtype=F32) * freq)
    else:
        inv_freqs = mx.reciprocal(freq).astype(F32)
    theta = positions[..., None] * inv_freqs
    cos, sin = mx.cos(theta).astype(x.dtype), mx.sin(theta).astype(x.dtype)
    if traditional:
        x1, x2 = x[..., 0:dims:2], x[..., 1:dims:2]
    else:
        x1, x2 = x[..., :half], x[..., half:dims]
    a, b = x1 * cos - x2 * sin, x1 * sin + x2 * cos
    if traditional:
        out = mx.stack([a, b], axis=-1).reshape(*x.shape[:-1], dims)
        parts = [out]
    else:
        parts = [a, b]
    if dims < x.shape[-1]:
        parts.append(x[..., dims:])
    return mx.concatenate(parts, axis=-1) if len(parts) > 1 else parts[0]


def _number(value: float) -> mx.array:
    key = (value, F32)
    got = _NUMBERS.get(key)
    if got is None:
        got = _NUMBERS[key] = mx.array(value, dtype=F32)
    return got


def _route(kind: tuple[Any, ...], ours: Callable[[], mx.array],
           theirs: Callable[[], mx.array]) -> mx.array:
    """Ours once the kind is known to agree bit for bit, mlx's once it is known not to. The
    first call of a kind computes both and records the verdict; it returns mlx's result
    either way (the same bits, when they agree). A chain that raises there (mx.compile
    refusing it, say) is a disagreement too."""
    verdict = _VERDICT.get(kind)
    if verdict is not None:
        return ours() if verdict else theirs()
    reference = theirs()
    try:
        mine = ours()
    except Exception as e:  # noqa: BLE001 -- any failure of ours means mlx's, said once
        if _quiet:
            raise  # the self-test's to report
        _VERDICT[kind] = False
        log(f"fused {kind[0]} failed for {kind[1:]} ({type(e).__name__}): mlx's is kept",
            WARNING)
        return reference
    try:
        same = mine.dtype == reference.dtype and mine.shape == reference.shape and bool(
            mx.array_equal(mine, reference, equal_nan=True).item())
    except Exception:  # noqa: BLE001 -- no eval here (inside someone's mx.compile): ask later
        return reference
    _VERDICT[kind] = same
    if not same and not _quiet:
        log(f"fused {kind[0]} differs from mlx's own for {kind[1:]}: mlx's is kept", WARNING)
    return reference


# ---- what the model code calls: mlx's own signatures. Only decode shapes (one position per
# sequence: a bounded set of shapes) take the chains. -------------------------------------------
def _rope(a: mx.array, dims: int, *, traditional: bool, base: float | None, scale: float,
          offset: int | mx.array, freqs: mx.array | None = None, stream: Any = None) -> mx.array:
    shape = a.shape
    if (stream is not None or len(shape) < 3 or shape[-2] != 1 or (base is None) == (freqs is None)
            or dims % 2 or not 0 < dims <= shape[-1]):
        return _STOCK["rope"](a, dims, traditional=traditional, base=base, scale=scale,
                              offset=offset, freqs=freqs, stream=stream)
    off = offset if isinstance(offset, mx.array) else mx.array(offset, dtype=mx.int32)
    kind = ("rope", a.dtype, len(shape), dims < shape[-1], traditional, base, off.dtype,
            off.size > 1, scale)

    def ours() -> mx.array:
        freq = _number(math.log(base) / (dims // 2)) if base is not None else freqs
        assert freq is not None  # one of the two, checked above
        return _rope_chain(a, off, _number(scale), freq, dims=dims, traditional=traditional,
                           exponent=base is not None)

    return _route(kind, ours, lambda: _STOCK["rope"](
        a, dims, traditional=traditional, base=base, scale=scale, offset=offset, freqs=freqs))


def _rms_norm(x: mx.array, weight: mx.array | None, eps: float, *,
              stream: Any = None) -> mx.array:
    shape = x.shape
    if stream is not None or len(shape) < 3 or shape[1] != 1:
        return _STOCK["rms_norm"](x, weight, eps, stream=stream)
    kind = ("rms_norm", x.dtype, None if weight is None else weight.dtype, shape[-1], eps)
    params = () if weight is None else (weight,)
    return _route(kind, lambda: _rms_chain(x, _number(eps), _number(1.0 / shape[-1]), *params),
                  lambda: _STOCK["rms_norm"](x, weight, eps))


def _layer_norm(x: mx.array, weight: mx.array | None, bias: mx.array | None, eps: float, *,
                stream: Any = None) -> mx.array:
    shape = x.shape
    if stream is not None or len(shape) < 3 or shape[1] != 1:
        return _STOCK["layer_norm"](x, weight, bias, eps, stream=stream)
    params = tuple(p for p in (weight, bias) if p is not None)
    kind = ("layer_norm", x.dtype, tuple(p.dtype for p in params), weight is not None,
            bias is not None, shape[-1], eps)

    def ours() -> mx.array:
        return _ln_chain(x, _number(eps), _number(1.0 / shape[-1]), *params,
                         has_weight=weight is not None, has_bias=bias is not None)

    return _route(kind, ours, lambda: _STOCK["layer_norm"](x, weight, bias, eps))
