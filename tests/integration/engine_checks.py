"""The batch engine (exod.runner.serving.batch_engine.BatchEngine) driven directly, in this
process, on models loaded as a runner loads them: continuous batching gives each request the
tokens it gets alone, a seed reproduces per request under overlap, the second turn of a chat hits
the prompt cache, the cache's byte cap evicts, and a cancel during a long prefill frees the batch
within a step. Run by test_engine.py in a pytest of its own (this imports mlx); the models come
from its environment (EXOD_TEST_TINY, EXOD_TEST_DEMO). What only a daemon shows (the API, the
ladder, status and reload) stays in test_serving_engine.py."""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import pytest

from exod.wire import messages as m
from exod.runner.cpu import blas

blas.preload()  # before mlx, as in the runner
from exod.runner.load import Loaded  # noqa: E402
from tests.integration.whole_model import load_whole  # noqa: E402
from exod.runner.serving.batch_engine import BatchEngine  # noqa: E402

QUESTIONS = ["What is the capital of France?", "Count to five.", "Name a colour.", "Say hi.",
             "What is 2+2?", "Tell a joke about cats.", "Why is the sky blue?",
             "Write a haiku about rain."]
# ~6k tokens: minutes of prefill for the demo model on this CPU if it ran as one step.
LONG = "Please summarise the following text. " + "The quick brown fox jumps over it. " * 700
ids = itertools.count()


def load(env: str) -> Loaded:
    return load_whole(Path(os.environ[env]))


@pytest.fixture(scope="module")
def demo() -> Loaded:
    return load("EXOD_TEST_DEMO")


@pytest.fixture(scope="module")
def tiny() -> Loaded:
    return load("EXOD_TEST_TINY")


def engine(loaded: Loaded, width: int = 1, cache_bytes: int = 1 << 30) -> BatchEngine:
    return BatchEngine(loaded.model, loaded.tokenizer, width=width, cache_bytes=cache_bytes)


def chat(content: str | list[dict[str, str]], **kw: Any) -> m.Generate:
    messages = [{"role": "user", "content": content}] if isinstance(content, str) else content
    return m.Generate(id=f"r{next(ids)}", kind="chat", messages=messages, **kw)


def run(e: BatchEngine, *reqs: m.Generate) -> list[tuple[str, m.Done]]:
    """Admit them all at once, step until every one is done: (text, Done) of each, in order."""
    for r in reqs:
        e.admit(r)
    texts = {r.id: "" for r in reqs}
    done: dict[str, m.Done] = {}
    while e.busy:
        for ev in e.step():
            assert not isinstance(ev, m.Error), ev
            if isinstance(ev, m.Text):
                texts[ev.id] += ev.text
            elif isinstance(ev, m.Done):
                done[ev.id] = ev
    return [(texts[r.id], done[r.id]) for r in reqs]


def test_overlapping_requests_get_what_each_gets_alone(demo: Loaded) -> None:
    """Greedy: token for token the same. Padding never enters here: BatchGenerator prefills
    each prompt as its own rows and masks nothing into a row from another, and on this model
    the 8 answers match exactly (were a near-tie ever flipped by a different matmul shape, it
    would show here as one differing answer). Sampling with a seed: the same text alone and
    beside others, because each request draws from a random key of its own."""
    e = engine(demo, width=8, cache_bytes=0)
    greedy: dict[str, Any] = {"max_tokens": 8, "temperature": 0}
    seeded: dict[str, Any] = {"max_tokens": 8, "temperature": 1.0, "seed": 1234}
    alone = [run(e, chat(q, **greedy))[0][0] for q in QUESTIONS]
    seeded_alone = run(e, chat(QUESTIONS[0], **seeded))[0][0]
    together = [t for t, _ in run(e, *[chat(q, **greedy) for q in QUESTIONS],
                                  chat(QUESTIONS[0], **seeded), chat(QUESTIONS[0], **seeded))]
    assert together[:8] == alone
    assert together[8] == together[9] == seeded_alone
    assert all(alone) and len(set(alone)) == 8


def test_second_turn_hits_the_prompt_cache(demo: Loaded) -> None:
    e = engine(demo)
    turn1 = [{"role": "user", "content": "What is the capital of France?"}]
    ((answer, done1),) = run(e, chat(turn1, max_tokens=12, temperature=0))
    first = e.serving()
    assert first.cache_entries == 1 and first.cache_bytes > 0 and first.cache_hits == 0

    turn2 = [*turn1, {"role": "assistant", "content": answer},
             {"role": "user", "content": "And of Italy?"}]
    ((_, done2),) = run(e, chat(turn2, max_tokens=12, temperature=0))
    assert done2.prompt_tokens > done1.prompt_tokens
    s = e.serving()
    assert s.cache_lookups == 2 and s.cache_hits == 1
    # At least the whole first prompt came from the cache, not from a prefill.
    assert s.cached_tokens >= done1.prompt_tokens


def test_byte_cap_evicts(tiny: Loaded) -> None:
    """Learn one entry's size with a roomy cap, then cap the cache at 1.5 entries: after three
    requests of the same size one entry is left, within the cap."""
    # logit_bias on the tiny model's end token: every answer has exactly max_tokens tokens.
    fixed: dict[str, Any] = {"max_tokens": 20, "temperature": 0, "logit_bias": {"2": -100}}
    prompts = ["apples and pears", "zebras in a field", "quiet morning rain"]
    roomy = engine(tiny)
    run(roomy, chat(prompts[0], **fixed))
    one = roomy.serving().cache_bytes
    assert one > 0 and roomy.serving().cache_entries == 1

    cap = one * 3 // 2
    capped = engine(tiny, cache_bytes=cap)
    for p in prompts:
        run(capped, chat(p, **fixed))
    s = capped.serving()
    assert s.cache_lookups == 3 and s.cache_max_bytes == cap
    assert s.cache_entries == 1 and 0 < s.cache_bytes <= cap


def test_a_cancel_during_prefill_frees_the_batch_within_a_step(demo: Loaded) -> None:
    e = engine(demo)
    long = chat(LONG, max_tokens=4)
    e.admit(long)
    events = e.step()  # one bounded chunk of the prompt, far from its end
    assert [type(ev) for ev in events] == [m.Prefill], events
    assert e.active == 1
    e.cancel(long.id)
    assert e.active == 0 and not e.busy and e.step() == []
    assert e.serving().cache_entries == 0  # a cancel stores nothing
    ((text, done),) = run(e, chat("Say hi.", max_tokens=3, temperature=0))
    assert text and done.completion_tokens <= 3


SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": {"items": {"type": "array", "maxItems": 6,
                                                "items": {"type": "string", "maxLength": 8}}},
     "required": ["items"], "additionalProperties": False},
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                      "tags": {"type": "array", "maxItems": 3,
                                               "items": {"enum": ["a", "b", "c"]}}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"ok": {"type": "boolean"},
                                      "score": {"type": "number", "maximum": 10}},
     "required": ["ok", "score"], "additionalProperties": False},
]


def test_constrained_rows_batched_follow_their_grammars_as_the_processor_path_does(
        tiny: Loaded, monkeypatch: pytest.MonkeyPatch) -> None:
    """Grammars applied by the batch's sampler, their masks computed for every row at once
    (exod.runner.serving.batch_sampler), against the same requests asking for logprobs, which
    keep the grammar as a logits processor: the same tokens, greedy, on a random-weight model; rows
    join the batch while others decode, some free, some constrained, and end at different
    steps. Every constrained answer that ended by itself is valid JSON for its schema. On this
    CPU every step's logits were caught, and its masks waited for the forward pass (whatever the
    log-softmax's size: this model's vocabulary is smaller than SOFTMAX_COVERS)."""
    import json

    import jsonschema

    from exod.runner.serving import mask_round

    caught: list[bool] = []
    apply = mask_round.MaskRound.apply

    def counted(self: Any, last: Any, rows: Any, logprobs: Any, logits: Any = None) -> Any:
        caught.append(logits is not None)
        return apply(self, last, rows, logprobs, logits)

    monkeypatch.setattr(mask_round.MaskRound, "apply", counted)
    monkeypatch.setattr(mask_round, "SOFTMAX_COVERS", 0)

    def asks(logprobs: bool) -> list[m.Generate]:
        fmt = [{"type": "json_schema", "schema": s} for s in SCHEMAS] + [{"type": "json_object"}]
        reqs = [chat(q, max_tokens=200, temperature=0, logprobs=logprobs,
                     response_format=fmt[i % len(fmt)] if i % 4 != 3 else None)
                for i, q in enumerate(QUESTIONS)]
        return reqs

    sampled: list[int] = []

    def serve(reqs: list[m.Generate]) -> list[tuple[str, str]]:
        e = engine(tiny, width=8, cache_bytes=0)
        texts = {r.id: "" for r in reqs}
        reasons: dict[str, str] = {}
        waiting = list(reqs)
        while waiting or e.busy:
            if waiting:  # one more request joins at every step
                e.admit(waiting.pop(0))
            for ev in e.step():
                assert not isinstance(ev, m.Error), ev
                if isinstance(ev, m.Text):
                    texts[ev.id] += ev.text
                elif isinstance(ev, m.Done):
                    reasons[ev.id] = ev.finish_reason
        assert e._sampling is not None, "mlx-lm's row order is gone: see batch_sampler"
        sampled.append(e._sampling.calls)
        return [(texts[r.id], reasons[r.id]) for r in reqs]

    plain, processed = asks(False), asks(True)
    by_sampler, by_processor = serve(plain), serve(processed)
    assert by_sampler == by_processor
    assert caught and all(caught), caught.count(False)
    assert all(sampled), sampled  # mlx-lm sampled every batch by the engine's one sampler
    ended = 0
    for r, (text, reason) in zip(plain, by_sampler, strict=True):
        if r.response_format is None or reason != "stop":
            continue
        ended += 1
        value = json.loads(text)
        if r.response_format["type"] == "json_schema":
            jsonschema.validate(value, r.response_format["schema"])
    assert ended >= 4, by_sampler


class _Rows:
    """A row's mask as the round reads it (exod.runner.serving.mask_round.Constraint)."""

    def __init__(self, words: Any) -> None:
        self.words = words


def _masks(vocab: int, width: int, seed: int) -> tuple[Any, list[tuple[int, Any]], Any]:
    """4 rows of `width` logprobs, rows 0 and 2 constrained by random masks over `vocab`
    tokens (a wider output layer's padding beyond), and the sum the matrix gives."""
    import mlx.core as mx
    import numpy as np

    from exod.runner.serving import mask_round

    rng = np.random.default_rng(seed)
    logits = mx.array(rng.normal(size=(4, width)).astype(np.float32))
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    rows = []
    for e in (0, 2):
        bits = rng.integers(0, 2, size=(vocab + 31) // 32 * 32, dtype=np.uint8)
        bits[vocab:] = 0  # llguidance sets no bit past the tokenizer's vocabulary
        rows.append((e, _Rows(np.packbits(bits, bitorder="little").view(np.uint32))))
    words = np.full((4, -(-width // 32)), mask_round.FREE, dtype=np.uint32)
    for e, r in rows:
        words[e, :r.words.size] = r.words
        words[e, r.words.size:] = 0
    return logprobs, rows, words


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("vocab,width", [(1024, 1024), (1000, 1024), (49152, 49152),
                                         (1000, 1000)])
def test_masks_applied_by_the_kernel_are_the_matrix_sum(dtype: str, vocab: int,
                                                        width: int) -> None:
    """The compiled kernel that applies a step's masks gives, every bit, the logprobs plus the
    masks' matrix (0 allowed, -inf refused): a free row untouched, a constrained row -inf where
    its bit is clear and past its words (padding); a width not a multiple of 32 takes the
    matrix. Twice: the first call checks the kernel, the second uses it."""
    import mlx.core as mx
    import numpy as np

    from exod.runner.serving import mask_round

    logprobs, rows, words = _masks(vocab, width, seed=vocab + width)
    logprobs = logprobs.astype(getattr(mx, dtype))
    expected = np.asarray((logprobs + mx.array(mask_round._matrix(words, width)).astype(
        logprobs.dtype)).astype(mx.float32))
    masks = mask_round.MaskRound()
    for _ in range(2):
        got = masks.apply([], rows, logprobs)
        assert got.dtype == logprobs.dtype and got.shape == logprobs.shape
        assert np.array_equal(np.asarray(got.astype(mx.float32)), expected)
    assert masks._kernel.get(logprobs.dtype) is (True if width % 32 == 0 else None)
    allowed = np.unpackbits(rows[0][1].words.view(np.uint8), bitorder="little")[:vocab]
    refused = np.isneginf(expected[0][:vocab])
    assert refused.sum() > 0 and np.array_equal(refused, allowed == 0)
    assert np.isneginf(expected[0][vocab:]).all() and not np.isinf(expected[1]).any()


def test_a_kernel_that_differs_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel whose result is not the matrix's at its first call (here: the bits read
    backwards) is dropped for the matrix, for that call and the ones after."""
    import mlx.core as mx
    import numpy as np

    from exod.runner.serving import mask_round

    wrong = mx.compile(lambda lp, w, s: mx.where(((w >> (31 - s)) & 1).astype(mx.bool_), lp,
                                                 -mx.inf))
    monkeypatch.setattr(mask_round, "_allowed", wrong)
    logprobs, rows, words = _masks(1024, 1024, seed=7)
    expected = np.asarray(logprobs + mx.array(mask_round._matrix(words, 1024)))
    masks = mask_round.MaskRound()
    for _ in range(2):
        assert np.array_equal(np.asarray(masks.apply([], rows, logprobs)), expected)
    assert masks._kernel[mx.float32] is False


def test_the_logits_tap_catches_what_a_step_normalises() -> None:
    """exod.runner.serving.logits_tap on a CPU: while armed, mlx-lm's `logits -
    logsumexp(logits)` leaves its logits to be taken once, at the logprobs' shape; not armed,
    or another shape, nothing. The wrapped logsumexp is mlx's own, every bit."""
    import mlx.core as mx
    import numpy as np

    from exod.runner.serving import logits_tap

    logits = mx.array(np.random.default_rng(3).normal(size=(4, 1000)).astype(np.float32))
    stock = mx.logsumexp(logits, axis=-1, keepdims=True)
    assert logits_tap.install() and logits_tap.install()  # idempotent
    try:
        logits_tap.arm()
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        assert logits_tap.take(logprobs.shape) is logits
        assert logits_tap.take(logprobs.shape) is None  # once
        assert np.array_equal(np.asarray(logprobs), np.asarray(logits - stock))
        logits_tap.arm()
        mx.logsumexp(logits[:1], axis=-1, keepdims=True)  # a row's: not the step's shape
        assert logits_tap.take(logprobs.shape) is None
        logits_tap.arm()
        logits_tap._here.armed = False  # a step not being built
        mx.logsumexp(logits, axis=-1, keepdims=True)
        assert logits_tap.take(logprobs.shape) is None
    finally:
        logits_tap.uninstall()
    logits_tap.arm()  # uninstalled: arming catches nothing
    mx.logsumexp(logits, axis=-1, keepdims=True)
    assert logits_tap.take(logits.shape[:1] + (1000,)) is None
