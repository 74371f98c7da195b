"""On a CPU, attention's heads computed a slice per core during prefill and in encoders.

mlx has no CPU kernel for `mx.fast.scaled_dot_product_attention`: there it runs as its fallback,
two matmuls around a softmax over every head's queries x keys, and the softmax (an exp per
score, on one thread) is most of it (docs/api.md, "Activations and attention on every core
during prefill"; `python -m bench split`). Heads are independent, so exod.runner.cpu.split's
thread allowance also cuts a call's heads into a slice per core, each computed by mlx's own
function on a CPU stream of its own, and joins them. A grouped-query call has its keys and
values repeated to one per query head first, so that a slice may end inside a group (the demo
model's 3 groups of 3 heads cut in two): the same scores, summed in the same order.

Installed only where a self-test at the runner's start finds every bit of mlx's own result, for
each form a model's call takes (plain, grouped, causal, an array mask per head or for all,
sinks); otherwise mlx's function stays, and the runner's log says why. A decode step (one query
per head), calls under MIN_SCORES and calls naming a stream stay whole. EXOD_SPLIT=0: off.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx

from exod.runner.cpu.streams import ActivationSplitter

# heads x queries x keys; below it, one core's exp is over before a split pays (bench split).
MIN_SCORES = 1 << 16
_STOCK: list[Callable[..., mx.array]] = []  # mlx's own function, while ours is installed


def install(splitter: ActivationSplitter) -> str:
    """Route large calls of mx.fast.scaled_dot_product_attention through the cut, if the
    self-test passes: "" when installed (or already), else why not."""
    if _STOCK:
        return ""
    stock = mx.fast.scaled_dot_product_attention
    differ = _self_test(stock, _cut(stock, splitter, lambda: 0), splitter)
    if differ:
        return differ
    _STOCK.append(stock)
    mx.fast.scaled_dot_product_attention = _cut(stock, splitter)
    return ""


def uninstall() -> None:
    """mlx's own function back (tests compare the two)."""
    if _STOCK:
        mx.fast.scaled_dot_product_attention = _STOCK.pop()


def _cut(stock: Callable[..., mx.array], splitter: ActivationSplitter,
         least: Callable[[], int] = lambda: MIN_SCORES) -> Callable[..., mx.array]:
    """mlx's attention with its heads cut where `splitter` allows, for calls of `least()`
    scores or more (the self-test cuts its small calls too)."""

    def sdpa(q: mx.array, k: mx.array, v: mx.array, *, scale: float,
             mask: mx.array | str | None = None, sinks: mx.array | None = None,
             **rest: Any) -> mx.array:
        n = splitter.allowed()
        heads, kv = q.shape[1] if q.ndim == 4 else 0, k.shape[1] if k.ndim == 4 else 0
        if (n < 2 or rest or heads < n or kv == 0 or heads % kv or q.shape[2] < 2
                or heads * q.shape[2] * k.shape[2] < least()):
            return stock(q, k, v, scale=scale, mask=mask, sinks=sinks, **rest)
        if kv != heads:  # one key/value head per query head: a slice may end inside a group
            k, v = mx.repeat(k, heads // kv, axis=1), mx.repeat(v, heads // kv, axis=1)
        cuts = [heads * i // n for i in range(n + 1)]
        parts = []
        for stream, a, b in zip(splitter.streams, cuts, cuts[1:], strict=False):
            with mx.stream(stream):
                parts.append(stock(q[:, a:b], k[:, a:b], v[:, a:b], scale=scale,
                                   mask=_heads(mask, a, b, heads),
                                   sinks=sinks[a:b] if sinks is not None else None))
        return mx.concatenate(parts, axis=1)

    return sdpa


def _heads(mask: mx.array | str | None, a: int, b: int, heads: int) -> mx.array | str | None:
    """A mask's part for heads a..b: one per head is cut, one for all heads is kept."""
    if isinstance(mask, mx.array) and mask.ndim == 4 and mask.shape[1] == heads:
        return mask[:, a:b]
    return mask


def _self_test(stock: Callable[..., mx.array], cut: Callable[..., mx.array],
               splitter: ActivationSplitter) -> str:
    """"" when the cut gives every bit of mlx's own result in each form, else the first that
    differs (or what a call raised)."""
    key = mx.random.key(11)
    forms: list[tuple[str, int, int, int, Any, bool]] = [  # name, heads, kv heads, L, mask, sinks
        ("plain", 4, 4, 24, None, False), ("grouped", 9, 3, 24, "causal", False),
        ("one key head", 4, 1, 24, "causal", False), ("mask per head", 6, 2, 20, "heads", False),
        ("mask for all", 6, 6, 20, "all", False), ("sinks", 4, 2, 24, "causal", True)]
    with splitter.cores(len(splitter.streams)):
        for name, heads, kv, length, how, sinks in forms:
            q, k, v = (mx.random.normal((2, h, length, 16), key=mx.random.key(12 + i))
                       for i, h in enumerate((heads, kv, kv)))
            mask: Any = how
            if how in ("heads", "all"):
                shape = (2, heads if how == "heads" else 1, length, length)
                mask = mx.random.uniform(shape=shape, key=key) > 0.3
            extra = {"sinks": mx.random.normal((heads,), key=key)} if sinks else {}
            try:
                want = stock(q, k, v, scale=0.17, mask=mask, **extra)
                got = cut(q, k, v, scale=0.17, mask=mask, **extra)
                same = want.shape == got.shape and bool(mx.array_equal(want, got).item())
            except Exception as e:  # noqa: BLE001 -- any failure keeps mlx's own function
                return f"the self-test's {name} call raised {type(e).__name__}: {e}"
            if not same:
                return f"the self-test's {name} call differs from mlx's own"
    return ""
