"""exod.runner.serving.quantized_batch against mlx-lm's own QuantizedKVCache and KVCache: the
rows of a batch, merged, stepped, filtered, extended, right-padded and extracted, hold exactly
what each request's own mlx-lm cache holds after the same tokens, and attention over the batch
is attention over each row's own cache. mlx on the CPU, tiny arrays: milliseconds."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.generate import maybe_quantize_kv_cache
from mlx_lm.models.base import scaled_dot_product_attention
from mlx_lm.models.cache import KVCache, QuantizedKVCache

from exod.runner.serving.quantized_batch import BatchQuantizedKVCache, Quant, rows

H, D = 2, 32  # kv heads, head dimension
Q8 = Quant(bits=8, group_size=32, start=0)


def kv(n: int, seed: int) -> tuple[mx.array, mx.array]:
    mx.random.seed(seed)
    return mx.random.normal((1, H, n, D)), mx.random.normal((1, H, n, D))


class Own:
    """One request's cache as mlx-lm's generate_step keeps it (quantized from `start`)."""

    def __init__(self, quant: Quant = Q8) -> None:
        self.quant, self.cache = quant, [KVCache()]

    def feed(self, keys: mx.array, values: mx.array) -> None:
        self.cache[0].update_and_fetch(keys, values)
        maybe_quantize_kv_cache(self.cache, self.quant.start, self.quant.group_size,
                                self.quant.bits)

    @property
    def c(self) -> Any:
        return self.cache[0]


def same(got: Any, own: Any) -> None:
    """`got` (extracted from a batch) holds what `own` holds, bit for bit, in its kind."""
    assert type(got) is type(own)
    assert got.offset == own.offset
    n = own.offset
    if isinstance(own, QuantizedKVCache):
        assert (got.bits, got.group_size) == (own.bits, own.group_size)
        mine: Any = own  # mlx-lm declares its arrays None
        for a, b in zip([*got.keys, *got.values], [*mine.keys, *mine.values], strict=True):
            assert mx.array_equal(a[..., :n, :], b[..., :n, :]).item()
    else:
        assert mx.array_equal(got.keys[..., :n, :], own.keys[..., :n, :]).item()
        assert mx.array_equal(got.values[..., :n, :], own.values[..., :n, :]).item()


def merge(owns: list[Own], quant: Quant = Q8) -> BatchQuantizedKVCache:
    """As BatchGenerator merges: the first request's cache's `merge` over every request's."""
    layers = [rows([o.c], quant)[0] for o in owns]
    got = layers[0].merge(layers)
    assert isinstance(got, BatchQuantizedKVCache)
    return got


def step(batch: BatchQuantizedKVCache, owns: list[Own], seed: int, n: int = 1) -> None:
    """`n` new tokens for every row, in the batch and in each row's own cache."""
    new = [kv(n, seed + i) for i in range(len(owns))]
    batch.update_and_fetch(mx.concatenate([k for k, _ in new]),
                           mx.concatenate([v for _, v in new]))
    for o, (k, v) in zip(owns, new, strict=True):
        o.feed(k, v)


def prefilled(lengths: list[int], quant: Quant = Q8, seed: int = 0) -> list[Own]:
    owns = []
    for i, n in enumerate(lengths):
        o = Own(quant)
        if n:
            o.feed(*kv(n, seed + 100 * i))
        owns.append(o)
    return owns


def test_merged_float_quantized_and_empty_rows_step_as_their_own_caches() -> None:
    owns = prefilled([5, 9, 0])
    owns[0].cache[0] = KVCache()  # a float cache under `start`'s check: quantized on merge
    owns[0].c.update_and_fetch(*kv(5, 0))
    assert isinstance(owns[1].c, QuantizedKVCache)
    batch = merge(owns)
    assert batch.quantized and batch.bits == 8 and batch.group_size == 32
    owns[0].cache = [owns[0].c.to_quantized(group_size=32, bits=8)]
    for s in range(3):
        step(batch, owns, seed=10 * s)
    for i, o in enumerate(owns):
        same(batch.extract(i), o.c)


def test_filter_and_extend_keep_each_row() -> None:
    a_owns, b_owns = prefilled([3, 7, 4], seed=1), prefilled([12, 2], seed=2)
    a, b = merge(a_owns), merge(b_owns)
    step(a, a_owns, seed=5)
    a.filter([0, 2])
    kept = [a_owns[0], a_owns[2]]
    assert a.size() == 5  # the longest row kept (4 + 1); padding every row had is gone
    a.extend(b)
    owns = kept + b_owns
    step(a, owns, seed=7, n=2)
    for i, o in enumerate(owns):
        same(a.extract(i), o.c)
    a.filter([3])
    same(a.extract(0), owns[3].c)


def test_a_right_padded_prompt_chunk_is_rolled_to_the_left() -> None:
    """BatchGenerator prefills prompts of different lengths together, right-padded, then
    `finalize` moves each row's padding to its left."""
    owns = prefilled([0, 0])
    batch = merge(owns)
    lengths = [3, 6]
    new = [kv(n, 40 + i) for i, n in enumerate(lengths)]
    pad = [max(lengths) - n for n in lengths]
    batch.prepare(lengths=lengths, right_padding=pad)
    batch.update_and_fetch(*(mx.concatenate([mx.pad(x[i], [(0, 0), (0, 0), (0, p), (0, 0)])
                                             for x, p in zip(new, pad, strict=True)])
                             for i in (0, 1)))
    batch.finalize()
    for o, (k, v) in zip(owns, new, strict=True):
        o.feed(k, v)
    assert batch.offset.tolist() == lengths and batch.left_padding.tolist() == [3, 0]
    step(batch, owns, seed=50)
    for i, o in enumerate(owns):
        same(batch.extract(i), o.c)


def test_float_until_start_then_quantized_as_generate_step_does() -> None:
    """quantized_kv_start 10: chunks of 6, 6, 1 tokens; mlx-lm quantizes after the call that
    brought the cache to 10, so the third call already attends over a quantized cache."""
    quant = Quant(8, 32, 10)
    owns = prefilled([0], quant)
    batch = merge(owns, quant)
    chunks = []
    for s, n in enumerate((6, 6, 1)):
        step(batch, owns, seed=60 + s, n=n)
        chunks.append(hasattr(batch, "bits"))
    assert chunks == [False, False, True]
    same(batch.extract(0), owns[0].c)
    # A request that holds `start` tokens joins as quantized (mlx-lm would have quantized it).
    assert merge(prefilled([0, 10], Quant(8, 32, 10)), Quant(8, 32, 10)).quantized


def test_a_row_left_with_no_token_is_float_for_its_first_call() -> None:
    """A prompt batch that held a longer row, filtered down to a row that has no token yet
    (BatchGenerator splits rows off as their prompts end): its first call attends over a float
    cache, as a fresh cache's does in generate_step, even with quantized_kv_start 0."""
    owns = prefilled([0, 0])
    batch = merge(owns[:1])
    step(batch, owns[:1], seed=90, n=5)
    batch.extend(merge(owns[1:]))
    batch.filter([1])
    assert batch.size() == 0
    step(batch, owns[1:], seed=91, n=3)
    assert not batch.quantized  # mlx-lm quantizes after this call, not before it
    step(batch, owns[1:], seed=92)
    assert batch.quantized
    same(batch.extract(0), owns[1].c)


def test_a_batch_is_one_kind_a_quantized_row_joining_quantizes_it() -> None:
    quant = Quant(8, 32, 100)
    floats, quantized = prefilled([4, 6], quant), prefilled([3], Q8)
    a, b = merge(floats, quant), merge(quantized, quant)
    assert not a.quantized and not hasattr(a, "bits") and b.quantized
    a.extend(b)
    assert a.quantized
    for o in floats:
        o.cache = [o.c.to_quantized(group_size=32, bits=8)]
    owns = floats + quantized
    step(a, owns, seed=70)
    for i, o in enumerate(owns):
        same(a.extract(i), o.c)


def test_attention_over_the_batch_is_each_rows_own() -> None:
    """mlx-lm's attention on the batch (its quantized path, with the batch's mask) against
    the same over each row's own QuantizedKVCache."""
    owns = prefilled([4, 11, 7], seed=3)
    batch = merge(owns)
    mx.random.seed(9)
    # 4 query heads over 2 kv heads, 2 new tokens; passed as `queries + 0` below: the quantized
    # attention scales its queries in place (`*=`)
    queries = mx.random.normal((3, 4, 2, D))
    new = [kv(2, 80 + i) for i in range(3)]
    mask = batch.make_mask(2)  # as the model makes it: before the layers add the tokens
    k, v = batch.update_and_fetch(mx.concatenate([x for x, _ in new]),
                                  mx.concatenate([y for _, y in new]))
    got = scaled_dot_product_attention(queries + 0, k, v, cache=batch, scale=D ** -0.5,
                                       mask=mask)
    for i, (o, (nk, nv)) in enumerate(zip(owns, new, strict=True)):
        own_mask = o.c.make_mask(2, return_array=False, window_size=None)
        ok, ov = o.c.update_and_fetch(nk, nv)
        want = scaled_dot_product_attention(queries[i:i + 1] + 0, ok, ov, cache=o.c,
                                            scale=D ** -0.5, mask=own_mask)
        assert mx.allclose(got[i:i + 1], want, atol=1e-5).item()


def test_extracted_caches_are_mlx_lms_own_trimmable_and_smaller() -> None:
    owns = prefilled([64, 64])
    batch = merge(owns)
    got = batch.extract(1)
    assert type(got) is QuantizedKVCache and got.is_trimmable()
    assert got.trim(10) == 10 and got.offset == 54
    floats = prefilled([64, 64], Quant(8, 32, 1000))
    plain = merge(floats, Quant(8, 32, 1000))
    assert type(plain.extract(0)) is KVCache
    # 8 bits a value and a float32 scale and bias per 32 values, against 32 bits a value.
    assert batch.nbytes == pytest.approx(plain.nbytes * (8 + 64 / 32) / 32)
    assert batch.trim(4) == 4 and batch.size() == 60
