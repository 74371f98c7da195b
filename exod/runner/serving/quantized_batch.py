"""A quantized KV cache inside mlx-lm's continuous batch (`BatchGenerator`), which has a batch
version of KVCache but none of QuantizedKVCache.

`BatchQuantizedKVCache` is one layer's cache for every row of a batch, laid out as mlx-lm's
BatchKVCache (rows left-padded to one length) and quantized as its QuantizedKVCache (packed
values, a scale and a bias per group), so mlx-lm's attention runs its quantized path on it.

When it is quantized follows mlx-lm's `maybe_quantize_kv_cache` (generate_step): the cache is
float until it holds `start` tokens, and quantized whole after the model call that brought it
there. A batch holds one kind for all its rows, so a batch is quantized as a whole: once any
row holds `start` tokens, or a quantized row joins it, every row is. A request alone in the
batch gets mlx-lm's own cache at each step; one beside a longer request may be quantized
sooner than it would be alone (docs/models.md, "A quantized KV cache in the batch").

Requests enter the batch with `rows`: their per-request caches, whose `merge` makes this batch
cache; `extract` gives back mlx-lm's own KVCache or QuantizedKVCache (what the prompt cache
stores, on disk by their class names).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import KVCache, QuantizedKVCache, _BaseCache, dynamic_roll

Leaves = tuple[mx.array, ...]  # float: (values,); quantized: (packed, scales, biases)


@dataclass(frozen=True)
class Quant:
    bits: int
    group_size: int
    start: int  # tokens a cache holds before it is quantized


class BatchQuantizedKVCache(_BaseCache):
    step = 256  # positions allocated at a time, as mlx-lm's caches do

    def __init__(self, left_padding: list[int], quant: Quant) -> None:
        self.quant = quant
        self.quantized = False
        self.keys: Leaves | None = None
        self.values: Leaves | None = None
        self.left_padding = mx.array(left_padding)
        self.offset = mx.array([-p for p in left_padding])
        self._idx = 0
        self._right_padding: mx.array | None = None

    # mlx-lm's attention takes the quantized path when the cache has `bits`: only once it is.
    @property
    def bits(self) -> int:
        if not self.quantized:
            raise AttributeError("bits")
        return self.quant.bits

    @property
    def group_size(self) -> int:
        return self.quant.group_size

    # ---- what the model calls -----------------------------------------------------------
    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[Any, Any]:
        # A call before brought it to `start`: generate_step's moment. Not with no token yet
        # (a row filtered out of a longer batch keeps empty arrays).
        if not self.quantized and self._idx > 0 and self._idx >= self.quant.start:
            self.quantize()
        new_k, new_v = self._encode(keys), self._encode(values)
        prev, n = self._idx, keys.shape[2]
        if self.keys is None or self.values is None or prev + n > self.keys[0].shape[2]:
            room = (self.step + n - 1) // self.step * self.step
            self.keys = _grow(self.keys, new_k, prev, room)
            self.values = _grow(self.values, new_v, prev, room)
        self._idx += n
        self.offset = self.offset + n
        for stored, new in ((self.keys, new_k), (self.values, new_v)):
            for s, x in zip(stored, new, strict=True):
                s[..., prev:self._idx, :] = x
        return self._fetch(self.keys), self._fetch(self.values)

    def make_mask(self, N: int, return_array: bool = False, **kwargs: Any) -> Any:  # noqa: N803
        return create_causal_mask(N, offset=self._idx, left_padding=self.left_padding, **kwargs)

    # ---- what BatchGenerator calls --------------------------------------------------------
    def prepare(self, *, left_padding: list[int] | None = None, lengths: Any = None,
                right_padding: list[int] | None = None) -> None:
        if left_padding is not None:
            if self.keys is not None:
                raise ValueError("left padding can only be added to an empty cache")
            pad = mx.array(left_padding)
            self.left_padding = self.left_padding + pad
            self.offset = self.offset - pad
        if right_padding is not None and max(right_padding) > 0:
            self._right_padding = mx.array(right_padding)

    def finalize(self) -> None:
        """After a right-padded prompt chunk: roll each row's padding to its left."""
        pad = self._right_padding
        if pad is None:
            return
        self._map(lambda x: dynamic_roll(x, pad[:, None], axis=2))
        self.offset = self.offset - pad
        self.left_padding = self.left_padding + pad
        self._right_padding = None

    def filter(self, batch_indices: Any) -> None:
        """Keep these rows, in this order; then drop the padding every row has."""
        self._map(lambda x: x[batch_indices])
        self.offset = self.offset[batch_indices]
        self.left_padding = self.left_padding[batch_indices]
        least = min(_ints(self.left_padding))
        if least > 0:
            self._map(lambda x: x[..., least:, :])
            self._idx -= least
            self.left_padding = self.left_padding - least

    def extend(self, other: BatchQuantizedKVCache) -> None:
        """Append `other`'s rows (both right-aligned at the longer one's length)."""
        if self.quantized != other.quantized:  # one kind for the whole batch
            for c in (self, other):
                c.quantize()
        if self.keys is None and other.keys is None:
            self.left_padding = mx.concatenate([self.left_padding, other.left_padding])
            self.offset = mx.concatenate([self.offset, other.offset])
            return
        idx = max(self._idx, other._idx)
        size = max(c.keys[0].shape[2] for c in (self, other) if c.keys is not None)
        like = self if self.keys is not None else other
        (k1, v1, pad1), (k2, v2, pad2) = (_aligned(c, like, idx, size) for c in (self, other))
        self.keys = tuple(mx.concatenate([a, b]) for a, b in zip(k1, k2, strict=True))
        self.values = tuple(mx.concatenate([a, b]) for a, b in zip(v1, v2, strict=True))
        self.offset = mx.concatenate([self.offset, other.offset])
        self.left_padding = mx.concatenate([pad1, pad2])
        self._idx = idx

    def extract(self, idx: int) -> KVCache | QuantizedKVCache:
        """Row `idx` as mlx-lm's own cache of one request."""
        if self.keys is None or self.values is None:
            return KVCache()
        pad = _ints(self.left_padding)[idx]
        keys, values = (tuple(mx.contiguous(x[idx:idx + 1, :, pad:self._idx]) for x in leaves)
                        for leaves in (self.keys, self.values))
        out: Any  # mlx-lm's classes declare their arrays None
        if self.quantized:
            out = QuantizedKVCache(group_size=self.quant.group_size, bits=self.quant.bits)
            out.keys, out.values = keys, values
        else:
            out = KVCache()
            (out.keys,), (out.values,) = keys, values
        out.offset = self._idx - pad
        return out

    @classmethod
    def merge(cls, caches: Sequence[Any], quant: Quant) -> BatchQuantizedKVCache:
        """One batch of these requests' caches (KVCache or QuantizedKVCache), quantized if any
        is, or if any holds `start` tokens (mlx-lm would have quantized it by now)."""
        lengths = [int(c.offset) for c in caches]
        longest = max(lengths)
        batch = cls([longest - n for n in lengths], quant)
        if longest == 0:
            return batch
        batch.quantized = (longest >= quant.start
                           or any(isinstance(c, QuantizedKVCache) for c in caches))
        encoded = [(i, batch._encode_row(c)) for i, c in enumerate(caches) if c.offset]
        like_k, like_v = encoded[0][1]
        batch.keys, batch.values = (
            tuple(mx.zeros((len(caches), x.shape[1], longest, x.shape[3]), x.dtype) for x in xs)
            for xs in (like_k, like_v))
        for i, (keys, values) in encoded:
            pad = longest - lengths[i]
            for stored, new in ((batch.keys, keys), (batch.values, values)):
                for s, x in zip(stored, new, strict=True):
                    s[i:i + 1, :, pad:] = x
        batch.offset = batch.offset + longest
        batch._idx = longest
        return batch

    def quantize(self) -> None:
        """From float to quantized, in place (the whole batch at once)."""
        if self.quantized:
            return
        self.quantized = True
        if self.keys is not None and self.values is not None:
            self.keys = self._encode(self.keys[0])
            self.values = self._encode(self.values[0])

    # ---- the rest of mlx-lm's cache interface -------------------------------------------------
    @property
    def state(self) -> tuple[Any, ...]:
        return self.keys, self.values, self.offset, self.left_padding, self._idx

    @state.setter
    def state(self, v: tuple[Any, ...]) -> None:
        self.keys, self.values, self.offset, self.left_padding, self._idx = v

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        n = min(self._idx, n)
        self._idx -= n
        self.offset = self.offset - n
        return n

    def size(self) -> int:
        return self._idx

    def empty(self) -> bool:
        return self.keys is None

    @property
    def nbytes(self) -> int:
        return sum(int(x.nbytes) for leaves in (self.keys, self.values) if leaves is not None
                   for x in leaves)

    # ---- inside --------------------------------------------------------------------------
    def _encode(self, x: mx.array) -> Leaves:
        if not self.quantized:
            return (x,)
        return tuple(mx.quantize(x, group_size=self.quant.group_size, bits=self.quant.bits))

    def _encode_row(self, c: Any) -> tuple[Leaves, Leaves]:
        """A request's cache (its first `offset` positions) in this batch's kind."""
        n = int(c.offset)
        if isinstance(c, QuantizedKVCache):
            if (c.bits, c.group_size) != (self.quant.bits, self.quant.group_size):
                raise ValueError(f"a {c.bits}-bit cache (group {c.group_size}) cannot join a "
                                 f"{self.quant.bits}-bit batch (group {self.quant.group_size})")
            packed: Any = (c.keys, c.values)
            return (tuple(x[..., :n, :] for x in packed[0]),
                    tuple(x[..., :n, :] for x in packed[1]))
        return self._encode(c.keys[..., :n, :]), self._encode(c.values[..., :n, :])

    def _fetch(self, leaves: Leaves) -> Any:
        got = tuple(x[..., :self._idx, :] for x in leaves)
        return got if self.quantized else got[0]

    def _map(self, f: Callable[[mx.array], mx.array]) -> None:
        if self.keys is not None and self.values is not None:
            self.keys = tuple(f(x) for x in self.keys)
            self.values = tuple(f(x) for x in self.values)


def _ints(a: mx.array) -> list[int]:
    got: Any = a.tolist()
    return [int(x) for x in got]


def _grow(stored: Leaves | None, new: Leaves, used: int, room: int) -> Leaves:
    """`stored` (its first `used` positions) with `room` more positions, shaped as `new`."""
    def more(x: mx.array) -> mx.array:
        return mx.zeros((*x.shape[:2], room, x.shape[3]), x.dtype)
    if stored is None:
        return tuple(more(x) for x in new)
    return tuple(mx.concatenate([s[..., :used, :], more(x)], axis=2)
                 for s, x in zip(stored, new, strict=True))


def _aligned(c: BatchQuantizedKVCache, like: BatchQuantizedKVCache, idx: int, size: int
             ) -> tuple[Leaves, Leaves, mx.array]:
    """`c`'s keys, values and left padding, its rows ending at `idx` of `size` positions."""
    rows = c.offset.shape[0]
    assert like.keys is not None and like.values is not None
    left = idx - c._idx

    def fit(stored: Leaves | None, shape: Leaves) -> Leaves:
        xs = stored if stored is not None else tuple(
            mx.zeros((rows, s.shape[1], 0, s.shape[3]), s.dtype) for s in shape)
        out = []
        for x in xs:
            right = size - x.shape[2] - left
            if right < 0:
                x, right = x[..., :right, :], 0
            if left or right:
                x = mx.pad(x, [(0, 0), (0, 0), (left, right), (0, 0)])
            out.append(x)
        return tuple(out)

    return fit(c.keys, like.keys), fit(c.values, like.values), c.left_padding + left


# ---- a request's cache on its way into the batch ----------------------------------------------
class RowKVCache(KVCache):
    """A request's float cache: merged with the others into a BatchQuantizedKVCache."""

    quant: Quant

    # mlx-lm's is a classmethod; BatchGenerator calls it on the first request's cache, whose
    # `quant` it needs.
    def merge(self, caches: Sequence[Any]) -> BatchQuantizedKVCache:  # type: ignore[override]
        return BatchQuantizedKVCache.merge(caches, self.quant)


class RowQuantizedKVCache(QuantizedKVCache):
    """A request's quantized cache (a prompt cache entry): merged as RowKVCache is."""

    quant: Quant

    def merge(self, caches: Sequence[Any]) -> BatchQuantizedKVCache:
        return BatchQuantizedKVCache.merge(caches, self.quant)


def rows(cache: list[Any], quant: Quant) -> list[Any]:
    """The request's cache, each layer's made mergeable into the batch (its arrays shared,
    not copied). Layers of other kinds stay as they are (KvOptions.problem refuses them)."""
    out: list[Any] = []
    for c in cache:
        row: Any
        if isinstance(c, QuantizedKVCache):
            row = RowQuantizedKVCache(group_size=c.group_size, bits=c.bits)
        elif isinstance(c, KVCache):
            row = RowKVCache()
        else:
            out.append(c)
            continue
        row.keys, row.values, row.offset, row.quant = c.keys, c.values, c.offset, quant
        out.append(row)
    return out
