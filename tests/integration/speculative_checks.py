"""Speculative decoding in the batch engine (exod.runner.serving.speculative), driven directly in
this process on models loaded as a runner loads them, against in-process mlx-lm with the model
alone: four requests decoded in one batch, each drafted and checked, get the model's own greedy
tokens (with its logprobs, and a logit bias seen at every drafted position); a request with a
grammar in the same batch stays valid; a second turn hits the prompt cache; rows that end early
or are cancelled leave the others untouched; a seeded row draws as without a draft.

The pair: a small model (the suite's tiny one) drafts for a deeper copy of itself
(tests.models.deep), whose tokens are mostly, not always, the draft's: rows accept and reject,
and rewind. Run by test_speculative.py in a pytest of its own (this imports mlx);
EXOD_TEST_DEMO (the draft) and EXOD_TEST_DEEP name the models."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any

import pytest

from exod.wire import messages as m
from exod.runner.cpu import blas

blas.preload()  # before mlx, as in the runner
import mlx.core as mx  # noqa: E402
from mlx_lm.generate import generate_step  # noqa: E402
from mlx_lm.sample_utils import make_logits_processors  # noqa: E402

from exod.runner.load import Loaded  # noqa: E402
from tests.integration.whole_model import load_whole  # noqa: E402
from exod.runner.serving.batch_engine import BatchEngine  # noqa: E402
from exod.runner.serving.gen_options import Draft  # noqa: E402
from exod.runner.text.load import load_draft  # noqa: E402

QUESTIONS = ["What is the capital of France?", "Count to five.", "Name a colour.", "Say hi."]
TOKENS = 3  # drafted a step
ids = itertools.count()


def load(env: str) -> Loaded:
    return load_whole(Path(os.environ[env]))


@pytest.fixture(scope="module")
def deep() -> Loaded:
    return load("EXOD_TEST_DEEP")


@pytest.fixture(scope="module")
def draft_model(deep: Loaded) -> Any:
    return load_draft(Path(os.environ["EXOD_TEST_DEMO"]), deep.dtype)


def engine(deep: Loaded, draft_model: Any, width: int = 4, cache_bytes: int = 0
           ) -> BatchEngine:
    return BatchEngine(deep.model, deep.tokenizer, width=width, cache_bytes=cache_bytes,
                       draft=Draft(draft_model, TOKENS))


def chat(content: str | list[dict[str, str]], **kw: Any) -> m.Generate:
    messages = [{"role": "user", "content": content}] if isinstance(content, str) else content
    return m.Generate(id=f"r{next(ids)}", kind="chat", messages=messages, **kw)


class Run:
    """Every request admitted at once, stepped to its end: texts, Done, logprobs, and the steps
    at which each request got text."""

    def __init__(self, e: BatchEngine, reqs: list[m.Generate],
                 cancel: dict[str, int] | None = None) -> None:
        for r in reqs:
            e.admit(r)
        self.text = {r.id: "" for r in reqs}
        self.done: dict[str, m.Done] = {}
        self.logprobs: dict[str, list[float]] = {r.id: [] for r in reqs}
        self.steps: list[set[str]] = []
        while e.busy:
            got: set[str] = set()
            for ev in e.step():
                assert not isinstance(ev, m.Error), ev
                if isinstance(ev, m.Text):
                    self.text[ev.id] += ev.text
                    got.add(ev.id)
                    self.logprobs[ev.id] += [t.logprob for t in ev.logprobs or ()]
                elif isinstance(ev, m.Done):
                    self.done[ev.id] = ev
            self.steps.append(got)
            for rid, at in (cancel or {}).items():
                if len(self.steps) == at:
                    e.cancel(rid)


def alone(deep: Loaded, e: BatchEngine, req: m.Generate, bias: dict[int, float] | None = None
          ) -> tuple[str, list[float], int]:
    """mlx-lm's greedy generation of the model alone (no draft, no batch) on the request's
    prompt as the engine reads it: (text, the chosen tokens' logprobs, tokens)."""
    prompt = mx.array(e.read(req).tokens)
    eos = set(deep.tokenizer.eos_token_ids)
    processors = make_logits_processors(bias) if bias else None
    tokens: list[int] = []
    logprobs: list[float] = []
    for token, lp in generate_step(prompt, deep.model, max_tokens=req.max_tokens,
                                   logits_processors=processors):
        tokens.append(int(token))
        logprobs.append(float(lp[int(token)]))
        if int(token) in eos:
            break
    detok = deep.tokenizer.detokenizer
    detok.reset()
    for t in tokens:
        if t not in eos:
            detok.add_token(t)
    detok.finalize()
    return str(detok.text), logprobs, len(tokens)


def test_four_requests_in_one_batch_get_the_models_own_greedy_tokens(
        deep: Loaded, draft_model: Any) -> None:
    e = engine(deep, draft_model)
    reqs = [chat(QUESTIONS[0], max_tokens=40, temperature=0, logprobs=True),
            chat(QUESTIONS[1], max_tokens=40, temperature=0, logit_bias={"2": -100}),
            chat(QUESTIONS[2], max_tokens=40, temperature=0),
            chat(QUESTIONS[3], max_tokens=40, temperature=0)]
    run = Run(e, reqs)
    for i, r in enumerate(reqs):
        text, logprobs, n = alone(deep, e, r, {2: -100.0} if i == 1 else None)
        assert run.text[r.id] == text, (i, run.text[r.id], text)
        assert run.done[r.id].completion_tokens == n
    ref_lp = alone(deep, e, reqs[0])[1]
    assert run.logprobs[reqs[0].id] == pytest.approx(ref_lp[:len(run.logprobs[reqs[0].id])],
                                                      abs=1e-3)
    assert len(run.logprobs[reqs[0].id]) >= len(ref_lp) - 1  # the last (an end) shows none
    assert run.done[reqs[1].id].completion_tokens == 40  # the bias kept the end token away
    assert any(len(got) == 4 for got in run.steps)  # one step gave each of the four a token
    s = e.serving()
    assert s.batching == "continuous" and s.draft_tokens == TOKENS
    # Every row speculated, and rows both kept and rejected drafts: rewinds happened.
    assert 0 < s.draft_accepted < s.drafted
    assert len(run.steps) < 40  # fewer steps than tokens: drafts were kept


SCHEMA: dict[str, Any] = {
    "type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                     "ok": {"type": "boolean"}},
    "required": ["name", "ok"], "additionalProperties": False}


def test_a_grammar_row_in_the_batch_stays_valid_and_the_others_keep_their_tokens(
        deep: Loaded, draft_model: Any) -> None:
    import jsonschema

    e = engine(deep, draft_model)
    free = [chat(q, max_tokens=30, temperature=0) for q in QUESTIONS[:3]]
    constrained = chat("Give a name as JSON.", max_tokens=60, temperature=0,
                       response_format={"type": "json_schema", "schema": SCHEMA})
    run = Run(e, [*free, constrained])
    for r in free:
        assert run.text[r.id] == alone(deep, e, r)[0]
    assert run.done[constrained.id].finish_reason == "stop"
    jsonschema.validate(json.loads(run.text[constrained.id]), SCHEMA)
    assert any(len(got) == 4 for got in run.steps)


def test_a_second_turn_hits_the_prompt_cache(deep: Loaded, draft_model: Any) -> None:
    e = engine(deep, draft_model, width=2, cache_bytes=1 << 30)
    turn1 = [{"role": "user", "content": QUESTIONS[0]}]
    first = chat(turn1, max_tokens=16, temperature=0)
    run1 = Run(e, [first])
    assert e.serving().cache_entries == 1 and e.serving().cache_hits == 0
    turn2 = [*turn1, {"role": "assistant", "content": run1.text[first.id]},
             {"role": "user", "content": "And of Italy?"}]
    second = chat(turn2, max_tokens=16, temperature=0)
    run2 = Run(e, [second])
    s = e.serving()
    assert s.cache_lookups == 2 and s.cache_hits == 1
    assert s.cached_tokens >= run1.done[first.id].prompt_tokens
    assert run2.text[second.id] == alone(deep, e, second)[0]  # the draft's cache came too


def test_rows_that_end_early_or_leave_do_not_touch_the_others(
        deep: Loaded, draft_model: Any) -> None:
    e = engine(deep, draft_model, width=5)
    long = chat(QUESTIONS[1], max_tokens=40, temperature=0)
    one = chat(QUESTIONS[0], max_tokens=1, temperature=0)
    gone = chat(QUESTIONS[2], max_tokens=40, temperature=0)
    ref_stop = alone(deep, e, chat(QUESTIONS[3], max_tokens=40, temperature=0))[0]
    word = ref_stop.split()[2] if len(ref_stop.split()) > 3 else ref_stop[-3:]
    stopped = chat(QUESTIONS[3], max_tokens=40, temperature=0, stop=[word])
    run = Run(e, [long, one, gone, stopped], cancel={gone.id: 3})
    assert run.text[long.id] == alone(deep, e, long)[0]
    assert run.done[one.id].completion_tokens == 1
    assert run.text[one.id] == alone(deep, e, one)[0]
    assert gone.id not in run.done
    assert run.done[stopped.id].finish_reason == "stop"
    assert run.text[stopped.id] == ref_stop[:ref_stop.index(word)]
    assert not e.busy and e.active == 0


def test_a_seeded_row_draws_as_without_a_draft_and_sampling_rows_speculate(
        deep: Loaded, draft_model: Any) -> None:
    seeded: dict[str, Any] = {"max_tokens": 20, "temperature": 0.8, "seed": 99}
    plain = BatchEngine(deep.model, deep.tokenizer, width=2, cache_bytes=0)
    (want,) = Run(plain, [r := chat(QUESTIONS[0], **seeded)]).text.values()
    del r
    e = engine(deep, draft_model)
    row = chat(QUESTIONS[0], **seeded)
    free = chat(QUESTIONS[1], max_tokens=20, temperature=0.8)
    run = Run(e, [row, free])
    assert run.text[row.id] == want
    assert run.done[free.id].completion_tokens >= 1
    s = e.serving()
    assert s.drafted > 0  # the unseeded row drafted; the seeded one took one token a step

