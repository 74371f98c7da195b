"""A KV cache as the tensors of a disk entry, and back: the mlx side of the disk tier.

The layout is mlx-lm's prompt cache format (`mlx_lm.models.cache.save_prompt_cache`): each
layer's `state` flattened by `mlx.utils.tree_flatten` into arrays named by their path, a Python
scalar stored as a 0-d array (a string as an array of its code points, None as an empty one) and
listed in the metadata, with the class of each layer's cache, so `load_prompt_cache` rebuilds
the caches. exod writes that layout itself, from arrays already evaluated, as bytes handed to
the writer thread (exod.runner.prompt_cache.entry_file): mlx itself is only touched here, on the
serve loop's thread. Reading is `load_prompt_cache`'s own: its arrays come lazily (mx.load
maps the file and reads a tensor when it is evaluated), so a load runs a bounded number of
bytes per engine step, as prefill runs a bounded number of tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten, tree_map
from mlx_lm.models import cache as mlx_cache
from mlx_lm.models.cache import can_trim_prompt_cache, load_prompt_cache

from exod.runner.prompt_cache.entry_file import Tensor

SAFETENSORS = {mx.float32: "F32", mx.float16: "F16", mx.bfloat16: "BF16", mx.float64: "F64",
               mx.int64: "I64", mx.int32: "I32", mx.int16: "I16", mx.int8: "I8",
               mx.uint64: "U64", mx.uint32: "U32", mx.uint16: "U16", mx.uint8: "U8",
               mx.bool_: "BOOL"}


def prepare(cache: list[Any]) -> None:
    """Make an entry's arrays its own, in the background: extracted from a batch they are views
    that keep the whole batch's buffers alive (and a view's bytes are not contiguous)."""
    for c in cache:
        c.state = tree_map(lambda x: mx.contiguous(x) if isinstance(x, mx.array) else x,
                           c.state)
    mx.async_eval([c.state for c in cache])


def nbytes(cache: list[Any]) -> int:
    return sum(int(c.nbytes) for c in cache)


def trimmable(cache: list[Any]) -> bool:
    return bool(can_trim_prompt_cache(cache))


def unstorable(cache: list[Any]) -> str | None:
    """Why this cache cannot go to disk (load_prompt_cache could not rebuild it), or None."""
    for name in _classes(cache):
        if not isinstance(getattr(mlx_cache, name, None), type):
            return f"its {name} is not one of mlx-lm's cache classes"
    for _, leaf in _flat(cache):
        if isinstance(leaf, mx.array) and leaf.dtype not in SAFETENSORS:
            return f"an array of {leaf.dtype}"
        if not isinstance(leaf, (mx.array, int, float, bool, str)) and leaf is not None:
            return f"a state leaf of type {type(leaf).__name__}"
    return None


def tensors(cache: list[Any], metadata: dict[str, str]) -> tuple[list[Tensor], dict[str, str]]:
    """The entry's tensors (bytes of evaluated arrays) and its whole metadata: exod's keys
    (`metadata`, already named as element 0 of the flattened list) then the classes and the
    scalars, as load_prompt_cache reads them. On the serve loop's thread: cheap once `prepare`d
    (the arrays are evaluated; the bytes are views, not copies)."""
    arrays: dict[str, mx.array] = {}
    scalars: list[tuple[str, str]] = []
    for path, leaf in _flat(cache):
        if isinstance(leaf, mx.array):
            arrays[path] = leaf
            continue
        kind = "none" if leaf is None else "string" if isinstance(leaf, str) else "scalar"
        scalars.append((path, kind))
        arrays[path] = (mx.array([]) if leaf is None
                        else mx.array([ord(ch) for ch in leaf]) if isinstance(leaf, str)
                        else mx.array(leaf))
    mx.eval(list(arrays.values()))
    out = []
    for name, a in arrays.items():
        view = _bytes(a)
        if not view.c_contiguous:  # an entry not prepared: a copy, here
            a = mx.contiguous(a)
            mx.eval(a)
            view = _bytes(a)
        out.append(Tensor(name, SAFETENSORS[a.dtype], tuple(a.shape), view.cast("B")))
    meta = dict(metadata)
    meta.update({f"1.{i}": name for i, name in enumerate(type(c).__name__ for c in cache)})
    meta["2.0"] = ""  # load_prompt_cache skips the first: it keeps the list from being empty
    for i, (path, kind) in enumerate(scalars, start=1):
        meta[f"2.{i}.0"], meta[f"2.{i}.1"] = path, kind
    return out, meta


def load(path: Path) -> tuple[list[Any], list[mx.array]]:
    """The entry's caches, as load_prompt_cache rebuilds them, and their arrays, still lazy:
    evaluating them reads the file."""
    cache = load_prompt_cache(str(path))
    return cache, [x for _, x in _flat(cache) if isinstance(x, mx.array)]


def _flat(cache: list[Any]) -> list[tuple[str, Any]]:
    """Every leaf of the caches' states, by its path (mlx-lm's names for the arrays)."""
    leaves: Any = tree_flatten([c.state for c in cache])
    return list(leaves)


def _bytes(a: mx.array) -> memoryview:
    """An evaluated array's own memory (the buffer protocol: no copy)."""
    buffer: Any = a
    return memoryview(buffer)


def _classes(cache: list[Any]) -> list[str]:
    names = []
    for c in cache:
        names.append(type(c).__name__)
        if isinstance(c, mlx_cache.CacheList):
            names += _classes(list(c.caches))
    return names
