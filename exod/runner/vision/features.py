"""The vision feature cache: what the vision tower made of each picture, kept by the picture's
SHA-256, so that a later request showing it again (the next turn, or another picture beside it)
runs the tower only on the pictures it has not seen.

It keeps the tower's own output rather than the features `get_input_embeddings` merges into the
prompt, so what each family does after its tower (a projector, a pixel shuffle, Qwen's M-RoPE
positions) runs as without a cache; mlx-vlm's own VisionFeatureCache serves none of the common
families. One tower call sees all of a request's pictures, and a `PictureLayout`, read from the
call, says which part of its inputs and output is whose (Qwen's `grid_thw` rows, Pixtral's
`image_sizes`, a row each for SigLIP and CLIP); a call it does not fit keeps its pictures
together, under all their hashes. A call about no cached picture is the call without a cache,
bit for bit; one about some runs the tower on the others only. The tower keeps its object: only
its class is swapped for a subclass that asks the cache first, while `seeing(keys)` says which
pictures the call is about. Least recently used out past `max_bytes` (0: no cache).
docs/design/vision.md, "Caches".
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

TOWERS = ("vision_tower", "vision_model")
Key = tuple[str, ...]  # the pictures' SHA-256s, in the order the call shows them


@dataclass(frozen=True)
class PictureLayout:
    """Where each picture of one call is: for each input (positional, then keyword) the axis
    and sizes of its pictures' parts, or None when it is the call's as a whole; for the output,
    the axis along which each array is split, with the pictures' shares (`weights`)."""

    inputs: tuple[tuple[int, list[int]] | None, ...]
    names: tuple[str, ...]  # the keyword inputs, in `inputs` after the positional ones
    out_axis: int
    weights: list[int]

    def select(self, args: tuple[Any, ...], kwargs: dict[str, Any],
               keep: list[int]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The call's inputs for the pictures `keep` only."""
        values = [*args, *(kwargs[k] for k in self.names)]
        picked = [v if where is None else _pick(v, *where, keep)
                  for v, where in zip(values, self.inputs, strict=True)]
        n = len(args)
        return tuple(picked[:n]), {**kwargs, **dict(zip(self.names, picked[n:], strict=True))}

    def split(self, out: Any) -> list[Any] | None:
        """The output, one part per picture (None when its arrays do not split so)."""
        axis, weights, total = self.out_axis, self.weights, sum(self.weights)
        arrays = [a for a in _leaves(out) if isinstance(a, mx.array)]
        if not arrays or any(a.ndim <= axis or any(a.shape[axis] * w % total for w in weights)
                             for a in arrays):
            return None

        def cut(a: mx.array, i: int) -> mx.array:
            sizes = [a.shape[axis] * w // total for w in weights]
            return _take(a, axis, sum(sizes[:i]), sizes[i])

        return [_map(out, functools.partial(cut, i=i)) for i in range(len(weights))]

    def join(self, parts: Sequence[Any]) -> Any:
        return _zip(parts, lambda xs: mx.concatenate(xs, axis=self.out_axis))


def layout(args: tuple[Any, ...], kwargs: dict[str, Any], n: int) -> PictureLayout | None:
    """Which part of a tower call (`args`, `kwargs`) is whose, for its `n` pictures, or None."""
    names = tuple(k for k, v in kwargs.items() if isinstance(v, mx.array))
    values = [*args, *(kwargs[k] for k in names)]
    arrays = [v for v in values if isinstance(v, mx.array)]
    if not arrays or n < 1:
        return None
    pixels = arrays[0]
    grid = next((v for v in values[1:] if isinstance(v, mx.array) and v.ndim == 2
                 and v.shape == (n, 3)), None)
    sizes = kwargs.get("image_sizes")
    if grid is not None and pixels.shape[0] != n:  # Qwen: patches of every picture, a grid each
        rows = [int(t * h * w) for t, h, w in _rows(grid)]
        if sum(rows) != pixels.shape[0]:
            return None
        inputs = tuple((0, rows) if v is pixels else (0, [1] * n) if v is grid else None
                       for v in values)
        return PictureLayout(inputs, names, 0, rows)
    if any(isinstance(v, mx.array) and v.ndim and v.shape[0] != n for v in values):
        return None
    inputs = tuple((0, [1] * n) if isinstance(v, mx.array) else None for v in values)
    if isinstance(sizes, mx.array) and sizes.shape == (n, 2):  # Pixtral: one sequence of all
        return PictureLayout(inputs, names, 1, [int(h * w) for h, w in _rows(sizes)])
    return PictureLayout(inputs, names, 0, [1] * n)


class FeatureCache:
    def __init__(self, model: Any, max_bytes: int) -> None:
        self.max_bytes = max(0, max_bytes)
        self._entries: collections.OrderedDict[Key, tuple[Any, int]] = collections.OrderedDict()
        self.nbytes = 0
        self.lookups = self.hits = 0  # pictures looked up, and found
        self.runs = 0  # tower calls run
        self._keys: Key | None = None
        self.tower = next((t for name in TOWERS if (t := getattr(model, name, None)) is not None),
                          None)
        if self.tower is not None and self.max_bytes:
            _ask_first(self.tower, self)

    @contextmanager
    def seeing(self, keys: Key) -> Iterator[None]:
        """Within: the tower's calls are about the pictures `keys` (none: no caching)."""
        self._keys = keys or None
        try:
            yield
        finally:
            self._keys = None

    def __len__(self) -> int:
        return len(self._entries)

    def run(self, call: Callable[..., Any], args: tuple[Any, ...],
            kwargs: dict[str, Any]) -> Any:
        """The tower's output for the current pictures: from the cache where it can, else
        `call(*args, **kwargs)` for the others, stored."""
        keys = self._keys
        if keys is None:
            self.runs += 1
            return call(*args, **kwargs)
        self.lookups += len(keys)
        whole = self._get(keys)  # the pictures kept together by an earlier call
        if whole is not None:
            self.hits += len(keys)
            return whole
        place = layout(args, kwargs, len(keys))
        found = [self._get((k,)) for k in keys] if place is not None else [None] * len(keys)
        missing = [i for i, f in enumerate(found) if f is None]
        self.hits += len(keys) - len(missing)
        if not missing:
            assert place is not None
            return place.join(found)
        self.runs += 1
        if place is None or len(missing) == len(keys):
            out = call(*args, **kwargs)  # the very call as without a cache
            parts = place.split(out) if place is not None else None
            if parts is None:
                self._put(keys, out)
            else:
                for k, part in zip(keys, parts, strict=True):
                    self._put((k,), part)
            return out
        sub_args, sub_kwargs = place.select(args, kwargs, missing)
        sub = PictureLayout(place.inputs, place.names, place.out_axis,
                     [place.weights[i] for i in missing])
        got = sub.split(call(*sub_args, **sub_kwargs))
        if got is None:
            raise RuntimeError("the vision tower's output does not split by picture")
        for i, part in zip(missing, got, strict=True):
            found[i] = part
            self._put((keys[i],), part)
        return place.join(found)

    def _get(self, key: Key) -> Any:
        hit = self._entries.get(key)
        if hit is None:
            return None
        self._entries.move_to_end(key)
        return hit[0]

    def _put(self, key: Key, out: Any) -> None:
        size = sum(a.nbytes for a in _leaves(out) if isinstance(a, mx.array))
        if size > self.max_bytes:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self.nbytes -= old[1]
        self._entries[key] = (out, size)
        self.nbytes += size
        while self.nbytes > self.max_bytes:
            _, (_, freed) = self._entries.popitem(last=False)
            self.nbytes -= freed


def _ask_first(tower: Any, cache: FeatureCache) -> None:
    base = type(tower)

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        return cache.run(lambda *a, **k: base.__call__(self, *a, **k), args, kwargs)

    tower.__class__ = type(f"Cached{base.__name__}", (base,), {"__call__": __call__})


# ---- nested outputs (tuples and lists of arrays) ------------------------------------------------
def _leaves(tree: Any) -> list[Any]:
    if isinstance(tree, (tuple, list)):
        return [x for t in tree for x in _leaves(t)]
    return [tree]


def _map(tree: Any, fn: Callable[[mx.array], Any]) -> Any:
    if isinstance(tree, (tuple, list)):
        return type(tree)(_map(t, fn) for t in tree)
    return fn(tree) if isinstance(tree, mx.array) else tree


def _zip(trees: Sequence[Any], fn: Callable[[list[mx.array]], Any]) -> Any:
    first = trees[0]
    if isinstance(first, (tuple, list)):
        return type(first)(_zip([t[i] for t in trees], fn) for i in range(len(first)))
    return fn(list(trees)) if isinstance(first, mx.array) else first


def _pick(value: mx.array, axis: int, sizes: list[int], keep: list[int]) -> mx.array:
    """The parts `keep` of `value`, cut along `axis` in parts of `sizes`."""
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return mx.concatenate([_take(value, axis, starts[i], sizes[i]) for i in keep], axis=axis)


def _rows(a: mx.array) -> list[list[int]]:
    rows: Any = a.astype(mx.int64).tolist()  # a 2-D array: a list of lists of ints
    return [[int(x) for x in row] for row in rows]


def _take(a: mx.array, axis: int, start: int, size: int) -> mx.array:
    index = [slice(None)] * a.ndim
    index[axis] = slice(start, start + size)
    return a[tuple(index)]
