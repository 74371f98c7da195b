"""The batch engine with a quantized KV cache (kv_bits), driven in this process on the tiny model
as a runner loads it, against in-process mlx-lm's generate_step with the same KV settings
(kv_bits 8, kv_group_size 32): requests at once in one batch each get generate_step's greedy
tokens; a long prompt alone is quantized where generate_step quantizes it (after the prefill
chunk that reaches quantized_kv_start); the prompt cache keeps quantized entries, smaller than
float ones, and a hit answers as the cold prefill did; a request that shares a prefix with one
in flight forks its quantized cache and answers as alone. Run by test_quantized_kv.py in a pytest
of its own (this imports mlx); the model comes from EXOD_TEST_TINY."""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import pytest

from exod.wire import messages as m
from exod.runner.cpu import blas

blas.preload()  # before mlx, as in the runner
import mlx.core as mx  # noqa: E402
from mlx_lm.generate import generate_step  # noqa: E402
from mlx_lm.models.cache import KVCache, QuantizedKVCache  # noqa: E402
from mlx_lm.sample_utils import make_logits_processors  # noqa: E402

from exod.runner.load import Loaded  # noqa: E402
from tests.integration.whole_model import load_whole  # noqa: E402
from exod.runner.serving.batch_engine import BatchEngine  # noqa: E402
from exod.runner.serving.gen_options import KvOptions  # noqa: E402

EOS = 2  # the tiny model's end token: banned, so every answer has max_tokens tokens
QUESTIONS = ["What is the capital of France?", "Count to five.", "Name a colour.",
             "Why is the sky blue? Answer in a few words, please."]
LONG = "Please summarise the following text. " + "The quick brown fox jumps over it. " * 60
ids = itertools.count()


@pytest.fixture(scope="module")
def tiny() -> Loaded:
    return load_whole(Path(os.environ["EXOD_TEST_TINY"]))


def engine(loaded: Loaded, kv: KvOptions | None, width: int = 4, cache_bytes: int = 0,
           prefill_step: int = 256) -> BatchEngine:
    return BatchEngine(loaded.model, loaded.tokenizer, width=width, cache_bytes=cache_bytes,
                       prefill_step=prefill_step, kv=kv)


def chat(content: str, max_tokens: int = 12, logprobs: bool = False) -> m.Generate:
    return m.Generate(id=f"q{next(ids)}", kind="chat",
                      messages=[{"role": "user", "content": content}], max_tokens=max_tokens,
                      temperature=0, logit_bias={str(EOS): -100}, logprobs=logprobs)


def run(e: BatchEngine, *reqs: m.Generate, logprobs: dict[str, list[float]] | None = None,
        one_a_step: bool = False) -> list[tuple[str, m.Done]]:
    """Admit them all at once (every one in the batch: width allows), or one a step (each
    joins while the others prefill or decode), and step until done. `logprobs`: filled with
    the chosen tokens' logprobs of each request that asked, by its id."""
    waiting = list(reqs)
    while waiting and not one_a_step:
        e.admit(waiting.pop(0))
    assert one_a_step or e.active == len(reqs)
    texts = {r.id: "" for r in reqs}
    done: dict[str, m.Done] = {}
    while e.busy or waiting:
        if waiting:
            e.admit(waiting.pop(0))
        for ev in e.step():
            assert not isinstance(ev, m.Error), ev
            if isinstance(ev, m.Text):
                texts[ev.id] += ev.text
                if logprobs is not None:
                    logprobs.setdefault(ev.id, []).extend(lp.logprob for lp in ev.logprobs)
            elif isinstance(ev, m.Done):
                done[ev.id] = ev
    return [(texts[r.id], done[r.id]) for r in reqs]


def reference(loaded: Loaded, e: BatchEngine, req: m.Generate, kv: KvOptions,
              prefill_step: int = 2048, logprobs: list[float] | None = None) -> str:
    """mlx-lm's own greedy text for the request's prompt, with the same KV settings."""
    tokens = e.read(req).tokens
    bias = make_logits_processors({EOS: -100})
    out = []
    for t, lp in generate_step(mx.array(tokens), loaded.model, max_tokens=req.max_tokens or 0,
                               logits_processors=bias, prefill_step_size=prefill_step,
                               **kv.generate_kwargs()):
        out.append(int(t))
        if logprobs is not None:
            logprobs.append(float(lp[int(t)]))
    detok = loaded.tokenizer.detokenizer
    detok.reset()
    for t in out:
        detok.add_token(t)
    detok.finalize()
    return str(detok.text)


def entries(e: BatchEngine) -> list[Any]:
    return [entry.payload for entry in e.cache.ram]


def test_requests_in_one_batch_get_generate_steps_quantized_tokens(tiny: Loaded) -> None:
    """quantized_kv_start 0: generate_step prefills each prompt (all but its last token) with a
    float cache, then quantizes; the batch does the same for each of its rows (each prompt
    here fits one chunk), whether they come together or join one a step."""
    kv = KvOptions(8, 32, 0)
    e = engine(tiny, kv)
    reqs = [chat(q, logprobs=True) for q in QUESTIONS]
    want_lp: list[list[float]] = [[] for _ in reqs]
    want = [reference(tiny, e, r, kv, logprobs=lp) for r, lp in zip(reqs, want_lp, strict=True)]
    for one_a_step in (False, True):
        got: dict[str, list[float]] = {}
        reqs = [chat(q, logprobs=True) for q in QUESTIONS]
        assert [t for t, _ in run(e, *reqs, logprobs=got, one_a_step=one_a_step)] == want
        for r, lp in zip(reqs, want_lp, strict=True):  # the cache quantized when mlx-lm's is
            assert got[r.id] == pytest.approx(lp, abs=1e-5), (one_a_step, r.id)
    alone = [run(e, chat(q))[0][0] for q in QUESTIONS]
    assert alone == want
    assert len(set(want)) == len(want) and all(want)
    assert e.serving().batching == "continuous" and e.serving().width == 4
    floats = engine(tiny, None)
    plain = [reference(tiny, floats, r, KvOptions()) for r in reqs]
    assert plain != want  # 8 bits changed at least one greedy token on this model


def test_a_long_prompt_is_quantized_after_the_chunk_that_reaches_the_start(tiny: Loaded) -> None:
    """quantized_kv_start 200, chunks of 128: float for two chunks, quantized from the third
    on, in the batch as in generate_step with the same chunk size: the same logprobs, which
    a float cache, or one quantized a chunk sooner or later, would not give."""
    kv = KvOptions(8, 32, 200)
    e = engine(tiny, kv, width=1, cache_bytes=1 << 30, prefill_step=128)
    req = chat(LONG, max_tokens=16, logprobs=True)
    assert len(e.read(req).tokens) > 400
    lps: dict[str, list[float]] = {}
    ((text, done),) = run(e, req, logprobs=lps)
    got = lps[req.id]
    want: list[float] = []
    assert text == reference(tiny, e, req, kv, prefill_step=128, logprobs=want)
    assert done.completion_tokens == len(got) == 16
    assert got == pytest.approx(want, abs=1e-5)
    for start in (0, 300, None):  # a chunk sooner, a chunk later, never
        other: list[float] = []
        reference(tiny, e, req, KvOptions(8 if start is not None else None, 32, start or 0),
                  prefill_step=128, logprobs=other)
        assert max(abs(a - b) for a, b in zip(other, want, strict=True)) > 1e-4, start
    (cache,) = entries(e)
    assert {type(c) for c in cache} == {QuantizedKVCache}
    short = engine(tiny, kv, width=1, cache_bytes=1 << 30)
    run(short, chat("Say hi.", max_tokens=4))  # under the start: a float cache, as mlx-lm's
    assert {type(c) for c in entries(short)[0]} == {KVCache}


def test_the_prompt_cache_keeps_quantized_entries_and_a_hit_answers_as_cold(tiny: Loaded
                                                                          ) -> None:
    kv = KvOptions(8, 32, 0)
    e = engine(tiny, kv, width=2, cache_bytes=1 << 30)
    ((cold, first),) = run(e, chat(LONG))
    assert first.cached_tokens == 0
    ((again, second),) = run(e, chat(LONG))
    assert again == cold and second.cached_tokens == second.prompt_tokens - 1
    s = e.serving()
    assert s.cache_hits == 1 and s.cache_entries == 1
    (cache,) = entries(e)
    assert {type(c) for c in cache} == {QuantizedKVCache}
    floats = engine(tiny, None, width=2, cache_bytes=1 << 30)
    run(floats, chat(LONG))
    # float32 values against 8 bits and a float32 scale and bias per 32 values
    ratio = s.cache_bytes / floats.serving().cache_bytes
    assert ratio == pytest.approx((8 + 64 / 32) / 32, rel=0.02)


def test_requests_sharing_a_prefix_fork_a_quantized_cache_as_alone(tiny: Loaded) -> None:
    """Two requests at once that share a long prefix: the second starts from a copy of the
    first's quantized cache (exod.runner.serving.shared_prefix) and answers as it does alone."""
    kv = KvOptions(8, 32, 0)
    e = engine(tiny, kv, width=2, cache_bytes=0)
    asks = [LONG + " In one word.", LONG + " In two sentences, please."]
    alone: dict[str, list[float]] = {}
    alone_ids: list[str] = []
    for a in asks:
        req = chat(a, max_tokens=16, logprobs=True)
        run(e, req, logprobs=alone)
        alone_ids.append(req.id)
    together: dict[str, list[float]] = {}
    reqs = [chat(a, max_tokens=16, logprobs=True) for a in asks]
    run(e, *reqs, logprobs=together)
    for a, t in zip(alone_ids, [r.id for r in reqs], strict=True):
        assert together[t] == pytest.approx(alone[a], abs=1e-5)
    assert alone[alone_ids[0]] != pytest.approx(alone[alone_ids[1]], abs=1e-3)
    assert e.serving().shared_hits >= 1
