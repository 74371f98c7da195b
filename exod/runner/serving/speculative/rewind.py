"""Rewinding rows of a batch's caches by different numbers of tokens: after a speculative step
each row keeps its own number of the tokens the batch read.

mlx-lm's BatchKVCache keeps its rows right-aligned: every row ends at one index, and a row's
start is told by its left padding. So the whole batch is trimmed by the least of the rows'
rewinds (`trim`), and each row with more to drop is shifted right by the rest, over what it
drops, its left padding growing by as much: what mlx-lm's own `prepare(right_padding=...)` and
`finalize()` do to a batch whose prompts ended at different places. Positions are per row
(`offset`), so a shifted row's next token gets its own position still. Padding that every row
has (once the row that had none has been shifted too) is cut off the front, as `filter` does,
once there is COMPACT of it: each cut copies the cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlx_lm.models.cache import BatchKVCache, KVCache

COMPACT = 64  # columns of padding every row has before they are cut off

__all__ = ["COMPACT", "rewindable", "rewind", "drop_last"]


def rewindable(cache: Sequence[Any]) -> bool:
    """Whether `rewind` can take rows of these (batch) caches back."""
    return all(type(c) is BatchKVCache for c in cache)


def rewind(cache: Sequence[Any], drops: Sequence[int]) -> None:
    """Drop the last `drops[r]` tokens of row r of every layer's BatchKVCache, in place."""
    if not drops:
        return
    least = min(drops)
    rest = [d - least for d in drops]
    shift = any(rest)
    for c in cache:
        if least:
            c.trim(least)
        if shift:
            c.prepare(right_padding=rest)
            c.finalize()
    if shift and cache:  # every layer has the same padding: read once
        common = int(cache[0].left_padding.min().item())
        if common >= COMPACT:
            for c in cache:
                _cut(c, common)


def _cut(c: BatchKVCache, common: int) -> None:
    if c.keys is not None:
        c.keys = c.keys[..., common:, :]
        c.values = c.values[..., common:, :]
    c._idx -= common  # mlx-lm's own filter() does the same to its private index
    c.left_padding = c.left_padding - common


def drop_last(cache: KVCache) -> KVCache:
    """A row's cache (extracted) without its last token."""
    if cache.offset:
        cache.keys = cache.keys[..., : cache.offset - 1, :]
        cache.values = cache.values[..., : cache.offset - 1, :]
        cache.offset -= 1
    return cache
