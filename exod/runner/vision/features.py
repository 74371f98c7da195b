"""The vision feature cache: what the vision tower made of a request's pictures, kept by their
SHA-256 (in order), so that the next turn about the same pictures skips the tower.

It keeps the tower's own output (`model.vision_tower(...)` or `model.vision_model(...)`,
whatever the family returns there) rather than the features `get_input_embeddings` merges into
the prompt: what each family does after its tower (a projector, a pixel shuffle, Qwen's M-RoPE
positions) runs as without a cache, so a hit gives the same embeddings, bit for bit, in every
family that has a tower under one of those names. mlx-vlm's own VisionFeatureCache serves only
the families with `encode_image(s)` (none of the common ones: docs/design/vision.md).

The tower keeps its object (its weights, its place in the model): only its class is swapped for
a subclass that asks the cache first, while `seeing(keys)` says which pictures the call is about.
Entries are evicted least recently used first past `max_bytes` (0: no cache).
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from exod.runner.split.blocks import flat_arrays

TOWERS = ("vision_tower", "vision_model")
Key = tuple[str, ...]


class FeatureCache:
    def __init__(self, model: Any, max_bytes: int) -> None:
        self.max_bytes = max(0, max_bytes)
        self._entries: collections.OrderedDict[Key, tuple[Any, int]] = collections.OrderedDict()
        self.nbytes = 0
        self.lookups = self.hits = 0
        self._key: Key | None = None
        self.tower = next((t for name in TOWERS if (t := getattr(model, name, None)) is not None),
                          None)
        if self.tower is not None and self.max_bytes:
            _ask_first(self.tower, self)

    @contextmanager
    def seeing(self, keys: Key) -> Iterator[None]:
        """Within: the tower's calls are about the pictures `keys` (none: no caching)."""
        self._key = keys or None
        try:
            yield
        finally:
            self._key = None

    def __len__(self) -> int:
        return len(self._entries)

    def run(self, call: Any) -> Any:
        """The tower's output for the current pictures: from the cache, or `call()` stored."""
        key = self._key
        if key is None:
            return call()
        self.lookups += 1
        hit = self._entries.get(key)
        if hit is not None:
            self.hits += 1
            self._entries.move_to_end(key)
            return hit[0]
        out = call()
        size = sum(a.nbytes for _, a in flat_arrays(out) if hasattr(a, "nbytes"))
        if size <= self.max_bytes:
            self._entries[key] = (out, size)
            self.nbytes += size
            while self.nbytes > self.max_bytes:
                _, (_, freed) = self._entries.popitem(last=False)
                self.nbytes -= freed
        return out


def _ask_first(tower: Any, cache: FeatureCache) -> None:
    base = type(tower)

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        return cache.run(lambda: base.__call__(self, *args, **kwargs))

    tower.__class__ = type(f"Cached{base.__name__}", (base,), {"__call__": __call__})
