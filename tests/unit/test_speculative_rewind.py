"""Rows of a left-padded batch cache rewound by their own counts
(exod.runner.serving.speculative.rewind): each row then holds exactly its own tokens, in place
for the next step: its next key lands right after them, and attention through the batch's mask
sees what that row's own cache would, nothing of what it dropped. Also once the padding every
row shares is cut off, and for a row's cache extracted without its last token. mlx on the CPU,
tiny arrays: milliseconds."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import BatchKVCache, KVCache

from exod.runner.serving.speculative import rewind as rw

H, D = 2, 4  # heads, head dimension


def keys(n: int, seed: int) -> mx.array:
    return mx.random.normal((1, H, n, D), key=mx.random.key(seed))


def solo(k: mx.array) -> KVCache:
    c = KVCache()
    c.update_and_fetch(k, k * 2)
    return c


def batch(lengths: list[int]) -> tuple[BatchKVCache, list[mx.array]]:
    rows = [keys(n, seed) for seed, n in enumerate(lengths)]
    return BatchKVCache.merge([solo(k) for k in rows]), rows


def step(cache: BatchKVCache, n: int, seed: int) -> list[mx.array]:
    """Every row reads `n` more tokens (a speculative step's k+1); the new keys of each row."""
    new = mx.random.normal((cache.offset.shape[0], H, n, D), key=mx.random.key(seed))
    cache.update_and_fetch(new, new * 2)
    return [new[i:i + 1] for i in range(new.shape[0])]


def held(cache: BatchKVCache, i: int) -> mx.array:
    c = cache.extract(i)
    assert c.offset == c.keys.shape[2]
    assert mx.array_equal(c.values, c.keys * 2)
    return c.keys


def attention(q: mx.array, k: mx.array, mask: mx.array | str | None = None) -> mx.array:
    return mx.fast.scaled_dot_product_attention(q, k, k * 2, scale=1.0, mask=mask)


@pytest.mark.parametrize("drops", [[0, 3, 1], [2, 2, 2], [4, 0, 4], [0, 0, 0]])
def test_each_row_keeps_its_own_tokens(drops: list[int]) -> None:
    cache, rows = batch([5, 2, 7])
    new = step(cache, 4, seed=10)
    rw.rewind([cache], drops)
    for i, d in enumerate(drops):
        want = mx.concatenate([rows[i], new[i][..., :4 - d, :]], axis=2)
        assert mx.array_equal(held(cache, i), want), i
        assert cache.offset[i].item() == want.shape[2]  # its next position


def test_the_next_token_lands_after_them_and_attention_sees_only_them() -> None:
    cache, rows = batch([5, 2, 7])
    drops = [3, 0, 2]
    new = step(cache, 4, seed=10)
    rw.rewind([cache], drops)
    mask = cache.make_mask(1)  # as a model makes it, before the step's keys go in
    nxt = step(cache, 1, seed=11)
    q = mx.random.normal((3, H, 1, D), key=mx.random.key(12))
    got = attention(q, cache.keys_and_values()[0], mask=mask)
    for i, d in enumerate(drops):
        want = mx.concatenate([rows[i], new[i][..., :4 - d, :], nxt[i]], axis=2)
        assert mx.array_equal(held(cache, i), want)
        assert mx.allclose(got[i:i + 1], attention(q[i:i + 1], want), atol=1e-5), i


def test_padding_every_row_has_is_cut_off_and_nothing_moves() -> None:
    cache, rows = batch([3, 3])
    kept: list[list[mx.array]] = [[r] for r in rows]
    for s in range(2 * rw.COMPACT):  # the rows take turns at dropping: both gather padding
        new = step(cache, 2, seed=100 + s)
        drops = [1, 0] if s % 2 else [0, 1]
        rw.rewind([cache], drops)
        for i, d in enumerate(drops):
            kept[i].append(new[i][..., :2 - d, :])
    assert int(cache.left_padding.min().item()) < rw.COMPACT
    assert cache.size() < 3 + 4 * rw.COMPACT  # what it would be, never cut
    for i in range(2):
        assert mx.array_equal(held(cache, i), mx.concatenate(kept[i], axis=2))


def test_only_plain_batch_caches_rewind() -> None:
    assert rw.rewindable([BatchKVCache([0, 1]), BatchKVCache([0, 0])])
    assert not rw.rewindable([BatchKVCache([0]), KVCache()])


def test_a_rows_cache_without_its_last_token() -> None:
    k = keys(5, 1)
    c = rw.drop_last(solo(k))
    assert c.offset == 4 and mx.array_equal(c.keys, k[..., :4, :])
    assert mx.array_equal(c.values, k[..., :4, :] * 2)
