"""The checks of exod.runner.cpu.fused (run by test_fused.py in a pytest of their own, so that the
suite's process never imports mlx): on the CPU, decode-shaped rope and norms go through compiled
chains whose results are bitwise mlx's own, in every dtype and for every form of their arguments
that model code uses; a chain that differs is caught at its first call and mlx's function kept.
The tokens of whole models against in-process mlx-lm are checked by the family tests
(tests/integration/test_families.py)."""

from __future__ import annotations

import itertools
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from exod.runner.cpu.blas import preload

preload()
import mlx.core as mx  # noqa: E402 -- after OpenBLAS, as in the runner

from exod.runner.cpu import fused  # noqa: E402

DTYPES = (mx.float32, mx.float16, mx.bfloat16)
Both = Callable[..., tuple[mx.array, mx.array]]


@pytest.fixture
def both() -> Iterator[Both]:
    """both(name, *args, **kw): mx.fast.<name> as mlx computes it, and as exod does once the
    call's kind has been compared (the second call of that kind)."""
    assert fused.install()
    stock = dict(fused._STOCK)
    assert set(stock) == {"rope", "rms_norm", "layer_norm"}
    assert all(getattr(mx.fast, n) is not stock[n] for n in stock)

    def run(name: str, *args: Any, **kw: Any) -> tuple[mx.array, mx.array]:
        a = stock[name](*args, **kw)
        getattr(mx.fast, name)(*args, **kw)  # the first of its kind: compared
        b = getattr(mx.fast, name)(*args, **kw)
        mx.eval(a, b)
        return a, b

    yield run
    fused.uninstall()
    assert mx.fast.rope is stock["rope"]


def same(a: mx.array, b: mx.array) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bool(mx.array_equal(a, b).item())


def rand(shape: tuple[int, ...], dtype: Any, seed: int) -> mx.array:
    return (mx.random.normal(shape, key=mx.random.key(seed)) * 3 + 0.5).astype(dtype)


def all_ours() -> bool:
    """Every kind of call met so far runs exod's chain (none fell back to mlx's)."""
    return bool(fused._VERDICT) and all(fused._VERDICT.values())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rope_is_bitwise_mlx_s(both: Both, dtype: Any) -> None:
    cases = itertools.product(
        [(1, 9, 1, 64), (4, 3, 1, 64), (1, 1, 96), (2, 1, 4, 1, 32)],  # one position each
        [False, True],  # traditional
        [0, 5, 4095, "array", "batch"],  # KVCache's int offset, BatchKVCache's per-row array
        ["base", "freqs"],
        [1, 2])  # rotary over all dims, or half of them
    for i, (shape, trad, offset, kind, part) in enumerate(cases):
        if offset == "batch" and len(shape) != 4:
            continue
        x = rand(shape, dtype, i)
        dims = shape[-1] // part
        off: int | mx.array = (mx.array(17) if offset == "array" else
                               mx.array([3, 0, 99, 1][: shape[0]]) if offset == "batch"
                               else int(offset))
        scale = 0.25 if i % 3 == 0 else 1.0
        if kind == "freqs":
            freqs = mx.exp(mx.arange(0, dims // 2, dtype=mx.float32) / 7.0)
            a, b = both("rope", x, dims, traditional=trad, base=None, scale=scale, offset=off,
                        freqs=freqs)
        else:
            base = (10000.0, 1e6, 500000.0)[i % 3]
            a, b = both("rope", x, dims, traditional=trad, base=base, scale=scale, offset=off)
        assert same(a, b), (shape, trad, offset, kind, part, scale, dtype)
        assert all_ours(), fused._VERDICT


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_norms_are_bitwise_mlx_s(both: Both, dtype: Any) -> None:
    for i, shape in enumerate([(1, 1, 576), (7, 1, 64), (2, 1, 8, 128)]):
        x = rand(shape, dtype, i)
        w, bias = rand(shape[-1:], dtype, 100 + i), rand(shape[-1:], dtype, 200 + i)
        for eps in (1e-5, 1e-6):
            for name, args, kw in [("rms_norm", (x, w, eps), {}),
                                   ("rms_norm", (x, None, eps), {}),
                                   ("rms_norm", (x,), {"weight": w, "eps": eps}),
                                   ("layer_norm", (x, w, bias, eps), {}),
                                   ("layer_norm", (x, w, None, eps), {}),
                                   ("layer_norm", (x, None, bias, eps), {}),
                                   ("layer_norm", (x, None, None, eps), {})]:
                a, b = both(name, *args, **kw)
                assert same(a, b), (name, shape, eps, dtype)
                assert all_ours(), fused._VERDICT


def test_a_chain_that_differs_is_caught_and_mlx_s_kept(monkeypatch: pytest.MonkeyPatch,
                                                       both: Both) -> None:
    """The safety net for another mlx whose fallback computes otherwise."""
    monkeypatch.setattr(fused, "_rms_chain", lambda x, eps, inv_n, *w: x * 2)
    x, w = rand((3, 1, 64), mx.float32, 1), rand((64,), mx.float32, 2)
    a, b = both("rms_norm", x, w, 1e-5)
    assert same(a, b)
    assert list(fused._VERDICT.values()) == [False]


def test_only_decode_shapes_are_compiled() -> None:
    """A prefill chunk (several positions) goes to mlx's own function at every call: mx.compile
    would keep an entry per chunk length. A decode shape calls mlx's once (the comparison)."""
    seen: list[tuple[int, ...]] = []

    def spy(original: Callable[..., mx.array]) -> Callable[..., mx.array]:
        def f(*a: Any, **kw: Any) -> mx.array:
            seen.append(tuple(a[0].shape))
            return original(*a, **kw)
        return f

    assert fused.install()
    real = dict(fused._STOCK)
    try:
        fused._STOCK["rope"], fused._STOCK["rms_norm"] = spy(real["rope"]), spy(real["rms_norm"])
        w = mx.ones((64,))
        for positions in (37, 1):
            x = rand((1, 4, positions, 64), mx.float32, 1)
            h = rand((1, positions, 64), mx.float32, 2)
            for _ in range(3):
                mx.eval(mx.fast.rope(x, 64, traditional=False, base=1234.5, scale=1.0,
                                     offset=3),
                        mx.fast.rms_norm(h, w, 1.5e-5))
        prefill = [s for s in seen if 37 in s]
        decode = [s for s in seen if 37 not in s]
        assert prefill == [(1, 4, 37, 64), (1, 37, 64)] * 3
        assert decode == [(1, 4, 1, 64), (1, 1, 64)]  # compared once, then exod's
        assert all_ours()
    finally:
        fused._STOCK.update(real)
        fused.uninstall()


def test_off_by_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXOD_FUSE", "0")
    before = mx.fast.rope
    assert not fused.install()
    assert mx.fast.rope is before


def changed_rope(a: mx.array, dims: int, *, traditional: bool, theta: float | None,
                 scale: float, offset: Any, freqs: Any = None, stream: Any = None) -> mx.array:
    """mx.fast.rope as another mlx might have it: `base` renamed."""
    return mx.array(0.0)


def other_rms_norm(x: mx.array, weight: mx.array | None, eps: float, *,
                   stream: Any = None) -> mx.array:
    """mx.fast.rms_norm as another mlx might compute it (a fallback that is not ours)."""
    return x * 2


@pytest.mark.parametrize(("name", "theirs", "why"), [
    ("rope", changed_rope, "TypeError"),
    ("rms_norm", other_rms_norm, "differs from mlx's own"),
])
def test_an_mlx_that_differs_keeps_its_own_functions(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], name: str,
        theirs: Callable[..., mx.array], why: str) -> None:
    """A stand-in mx.fast whose function takes other arguments, or computes otherwise: the
    self-test fails, the patch is removed, one line says so, and mx.fast holds that mlx's
    own functions, which the models then call."""
    fast = types.SimpleNamespace(rope=mx.fast.rope, rms_norm=mx.fast.rms_norm,
                                 layer_norm=mx.fast.layer_norm)
    setattr(fast, name, theirs)
    before = dict(vars(fast))
    monkeypatch.setattr(mx, "fast", fast)
    assert not fused.install()
    assert vars(fast) == before
    assert not fused._STOCK and not fused._VERDICT
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("<4>decode-step rope and norms not fused: the self-test failed")
    assert why in lines[0] and lines[0].endswith("mlx's own functions run")
    assert fused.install() is False  # and again, from scratch: nothing half-installed


@pytest.mark.parametrize("version", ["0.33.0", "0.31.9", "1.32.0", "0.32-custom", "dev"])
def test_an_mlx_outside_the_checked_versions_is_not_patched(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        version: str) -> None:
    stock = mx.fast.rope, mx.fast.rms_norm, mx.fast.layer_norm
    monkeypatch.setattr(mx, "__version__", version)
    accepted = version.startswith("0.32")
    assert fused.install() is accepted
    try:
        lines = capsys.readouterr().err.splitlines()
        if accepted:
            assert lines == [] and mx.fast.rope is not stock[0]
        else:
            assert (mx.fast.rope, mx.fast.rms_norm, mx.fast.layer_norm) == stock
            assert len(lines) == 1 and version in lines[0], lines
            assert "checked on mlx >=0.32,<0.33" in lines[0]
    finally:
        fused.uninstall()


def test_the_versions_checked_include_the_installed_one() -> None:
    assert fused.unchecked_version(mx.__version__) == ""


def test_the_self_test_runs_every_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    """It compares the chains themselves (their verdicts are then dropped, so that the
    compiled kernels are compared at their first real call), with mx.compile off, and turns
    it back on."""
    calls: dict[str, int] = {}

    def counted(name: str, chain: Callable[..., mx.array]) -> Callable[..., mx.array]:
        def f(*a: Any, **kw: Any) -> mx.array:
            calls[name] = calls.get(name, 0) + 1
            return chain(*a, **kw)
        return f

    for name in ("_rope_chain", "_rms_chain", "_ln_chain"):
        monkeypatch.setattr(fused, name, counted(name, getattr(fused, name)))
    assert fused.install()
    try:
        assert set(calls) == {"_rope_chain", "_rms_chain", "_ln_chain"}, calls
        assert fused._VERDICT == {}
        traced: list[int] = []

        def body(x: mx.array) -> mx.array:
            traced.append(1)
            return x + 1

        f, x = mx.compile(body), mx.ones((3,))
        mx.eval(f(x), f(x))
        assert traced == [1]  # traced once: it ran uncompiled, and compiling is back on
    finally:
        fused.uninstall()


def test_a_chain_that_raises_at_its_first_call_is_mlx_s(monkeypatch: pytest.MonkeyPatch,
                                                        both: Both) -> None:
    def broken(*a: Any, **kw: Any) -> mx.array:
        raise ValueError("mx.compile refused it")

    monkeypatch.setattr(fused, "_ln_chain", broken)
    x, w = rand((3, 1, 64), mx.float32, 1), rand((64,), mx.float32, 2)
    a, b = both("layer_norm", x, w, None, 1e-5)
    assert same(a, b)
    assert list(fused._VERDICT.values()) == [False]
