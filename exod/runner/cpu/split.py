"""On a CPU, a model's activation functions computed by every core at once.

mlx's CPU backend runs an elementwise op on one thread, and its transcendental ones (erf, exp)
are slow there: activations kept one core busy while only OpenBLAS's matmuls used the others.
An activation is position-wise, so its rows (a sequence's positions, the next-to-last axis) are
cut into a slice per core, each computed on a CPU stream of its own and joined again: the same
op on the same elements, so every bit is the whole op's. Activation modules (nn.GELU, nn.SiLU...)
are wrapped where found. A gated MLP calls its activation as a function, so its class is
swapped for a subclass (the module keeps its object and weights) that cuts only the activation
and product, once the function the family applies is found among the candidates (mlx-lm's
swiglu, silu, the GELUs) by agreeing with the module's own call on every bit; else it keeps its
call, and `install` says so. A decode step (one position) and inputs under MIN_ELEMENTS are
never cut; a thread whose step already runs a pass per core (exod.runner.embed.encoder) keeps
its passes whole (`ActivationSplitter.allow`). EXOD_SPLIT=0: off. docs/api.md, "Activations and
attention on every core during prefill"; docs/design/runner-cpu.md; `python -m bench split`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from exod.runner.cpu import attention
from exod.runner.cpu.streams import ActivationSplitter
from exod.runner.split.pipeline import is_stand_in

# Position-wise activations whose elements cost enough to share out (exp, erf, tanh inside).
ACTIVATIONS: tuple[type[nn.Module], ...] = (
    nn.GELU, nn.SiLU, nn.Sigmoid, nn.Tanh, nn.Mish, nn.Softplus, nn.ELU, nn.CELU, nn.SELU,
    nn.LogSigmoid)
# Below this, one core's erf is over before handing out slices pays (`python -m bench split`).
MIN_ELEMENTS = 32_768


def enabled() -> bool:
    return mx.default_device() == mx.cpu and os.environ.get("EXOD_SPLIT", "1") != "0"


class SplitRows(nn.Module):
    """An activation module whose input's rows (the next-to-last axis) are cut into a slice
    per allowed core when the input is large enough."""

    def __init__(self, inner: nn.Module, splitter: ActivationSplitter) -> None:
        super().__init__()
        self.inner = inner
        self._splitter = splitter  # not a child: kept out of the module tree's parameters

    def __call__(self, x: mx.array) -> mx.array:
        cut = rowwise(self._splitter, self.inner, x)
        return self.inner(x) if cut is None else cut


def rowwise(splitter: ActivationSplitter, fn: Callable[..., mx.array],
            *xs: mx.array) -> mx.array | None:
    """fn(*xs), elementwise over arrays of one shape, computed a slice of rows per allowed core;
    None where it is not worth cutting (one core, few rows, a small input)."""
    n = splitter.allowed()
    x = xs[0]
    rows = x.shape[-2] if x.ndim >= 2 else 0
    if n < 2 or rows < n or x.size < MIN_ELEMENTS:
        return None
    cuts = [rows * i // n for i in range(n + 1)]
    parts = []
    for stream, a, b in zip(splitter.streams, cuts, cuts[1:], strict=False):
        with mx.stream(stream):
            parts.append(fn(*(v[..., a:b, :] for v in xs)))
    return mx.concatenate(parts, axis=-2)


def split_activations(model: nn.Module, splitter: ActivationSplitter) -> int:
    """Wrap every activation module of `model` (in place); the number wrapped."""
    count = 0

    def wrap(value: Any) -> Any:
        nonlocal count
        if isinstance(value, ACTIVATIONS):
            count += 1
            return SplitRows(value, splitter)
        return value

    def visit(_: str, module: nn.Module) -> None:
        if isinstance(module, SplitRows):
            return
        for key, value in list(module.items()):
            if isinstance(value, list):
                module[key] = [wrap(v) for v in value]
            elif isinstance(value, ACTIVATIONS):
                module[key] = wrap(value)

    model.apply_to_modules(visit)
    return count


# ---- gated MLPs -------------------------------------------------------------------------------

Gate = Callable[[mx.array, mx.array], mx.array]  # (gate, up) -> act(gate) * up


def _candidates() -> list[tuple[str, Gate]]:
    """The activations a gated MLP may apply (mlx-vlm's own swiglu is mlx-lm's, bit for bit:
    its models match the first)."""
    from mlx_lm.models.activations import swiglu

    return [("swiglu", swiglu), ("silu", lambda g, u: nn.silu(g) * u),
            ("gelu_approx", lambda g, u: nn.gelu_approx(g) * u),
            ("gelu", lambda g, u: nn.gelu(g) * u),
            ("gelu_fast_approx", lambda g, u: nn.gelu_fast_approx(g) * u)]


@dataclass(frozen=True)
class Gated:
    """What `install` did to a model's gated MLPs: classes swapped (with their function), and
    classes left as they are (with why)."""

    swapped: dict[str, str]
    kept: dict[str, str]
    modules: int


PROJECTIONS = (nn.Linear, nn.QuantizedLinear)  # not a group's sharded ones: their call talks


def _is_gated(module: nn.Module) -> bool:
    return all(type(getattr(module, name, None)) in PROJECTIONS
               for name in ("gate_proj", "up_proj", "down_proj"))


def _projection(module: nn.Module) -> tuple[int, mx.Dtype] | None:
    """The width and dtype of `module`'s input, read off its gate projection (a quantized
    one's from its scales), or None where they cannot be read."""
    proj = module.gate_proj
    scales, weight = getattr(proj, "scales", None), getattr(proj, "weight", None)
    if isinstance(scales, mx.array) and isinstance(getattr(proj, "group_size", None), int):
        return scales.shape[-1] * proj.group_size, scales.dtype
    if isinstance(weight, mx.array) and mx.issubdtype(weight.dtype, mx.floating):
        return weight.shape[-1], weight.dtype
    return None


def _find_gate(module: nn.Module) -> tuple[str, Gate] | str:
    """The candidate whose MLP is bitwise the module's own on a random input, or why none."""
    found = _projection(module)
    if found is None:
        return "its input width is unknown"
    width, dtype = found
    x = (mx.random.normal((1, 64, width), key=mx.random.key(7)) * 2).astype(dtype)
    try:
        want = type(module).__call__(module, x)
        g, u = module.gate_proj(x), module.up_proj(x)
        for name, fn in _candidates():
            got = module.down_proj(fn(g, u))
            if got.shape == want.shape and mx.array_equal(got, want).item():
                return name, fn
    except Exception as e:  # noqa: BLE001 -- a family's own call: whatever it raises, keep it
        return f"its own call raised {type(e).__name__}: {e}"
    return "no known activation gives its every bit"


def _key(module: nn.Module) -> tuple[type, type, str]:
    """Modules of one class may differ in what their call meets (a quantized projection, a
    dtype): each such kind is checked on its own."""
    found = _projection(module)
    return type(module), type(module.gate_proj), str(found[1] if found is not None else None)


def _swapped_class(base: type, gate: Gate, splitter: ActivationSplitter) -> type:
    def __call__(self: Any, x: mx.array) -> mx.array:
        g, u = self.gate_proj(x), self.up_proj(x)
        h = rowwise(splitter, gate, g, u)
        if h is None:
            return base.__call__(self, x)
        return self.down_proj(h)

    return type(f"Split{base.__name__}", (base,), {"__call__": __call__, "_exod_split": True})


def split_gated(model: nn.Module, splitter: ActivationSplitter) -> Gated:
    """Swap the class of every gated MLP of `model` whose activation is found (in place)."""
    swapped: dict[str, str] = {}
    kept: dict[str, str] = {}
    made: dict[tuple[type, type, str], type | None] = {}
    classes: dict[tuple[type, Gate], type] = {}
    count = 0

    def visit(_: str, module: nn.Module) -> None:
        nonlocal count
        base = type(module)
        if getattr(base, "_exod_split", False) or not _is_gated(module):
            return
        key = _key(module)
        if key not in made:
            found = _find_gate(module)
            if isinstance(found, str):
                kept[base.__name__] = found
                made[key] = None
            else:
                swapped[base.__name__] = found[0]
                if (base, found[1]) not in classes:
                    classes[base, found[1]] = _swapped_class(base, found[1], splitter)
                made[key] = classes[base, found[1]]
        cls = made[key]
        if cls is not None:
            module.__class__ = cls
            count += 1

    for module in run_modules(model):
        visit("", module)
    return Gated(swapped, kept, count)


def run_modules(model: nn.Module) -> list[nn.Module]:
    """The modules of `model` that its forward runs: not those inside a pipeline rank's
    stand-in blocks (exod.runner.split.pipeline). Their weights must stay unread: trying a
    stand-in's MLP on an input would read its weights from disk and keep them."""
    found: list[nn.Module] = []
    stack = [model]
    while stack:
        module = stack.pop()
        if is_stand_in(module):
            continue
        found.append(module)
        children = cast("list[tuple[str, nn.Module]]",
                        tree_flatten(module.children(), is_leaf=nn.Module.is_module))
        stack.extend(child for _, child in children)
    return found


@dataclass(frozen=True)
class Installed:
    splitter: ActivationSplitter
    activations: int  # activation modules wrapped
    gated: Gated
    attention: str  # "" where attention's heads are cut, else why not

    def describe(self) -> str:
        """One line for the runner's log."""
        kept = "; ".join(f"{k} kept whole ({why})" for k, why in self.gated.kept.items())
        done = ", ".join(f"{k} ({fn})" for k, fn in self.gated.swapped.items()) or "none"
        heads = "attention's heads" if not self.attention else \
            f"attention whole ({self.attention})"
        return (f"activations over {len(self.splitter.streams)} cores in prefill and encoders "
                f"(EXOD_SPLIT=0: off): {self.activations} activation module(s), "
                f"{self.gated.modules} gated MLP(s) of {done}, {heads}"
                + (f"; {kept}" if kept else ""))


# One per process: attention's cut is mx.fast's, process-wide.
_SPLITTER: list[ActivationSplitter] = []


def install(model: nn.Module, cores: int) -> Installed | None:
    """Cut `model`'s activations and attention's heads a slice per core from now on (where
    `allow`ed), on a CPU with more than one core; None where nothing is cut."""
    if cores < 2 or not enabled():
        return None
    if not _SPLITTER:
        _SPLITTER.append(ActivationSplitter(cores))
    splitter = _SPLITTER[0]
    return Installed(splitter, split_activations(model, splitter),
                     split_gated(model, splitter), attention.install(splitter))


def cores() -> int:
    """The cores this process may run on (its affinity: a service's CPUAffinity, taskset)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else os.cpu_count() or 1


def here(model: nn.Module) -> str:
    """`install` over this process's cores, cutting on this thread (the one that runs the
    model) from now on; what was done, for the runner's log."""
    done = install(model, cores())
    if done is None:
        return "activations whole (one core, not a CPU, or EXOD_SPLIT=0)"
    done.splitter.allow(len(done.splitter.streams))
    return done.describe()
