"""Fair shares of the batch (exod.runner.serving.fair_share) in the batch engine, driven directly
in this process on models loaded as a runner loads them. Run by test_fair_engine.py in a pytest
of its own (this imports mlx).

A full batch starts the key least served next, not the next in line; `batch` work is held back
between steps while interactive work waits or is in its prompt (decoding, or in its own
prompt), and comes back where it was: every request's text is what in-process mlx-lm generates
for it alone (greedy, its end token banned), held back or not, on the tiny model (plain KV
caches) and on zoo families whose caches cannot be rewound (a recurrent state, a sliding
window). First come first served (`fair=False`) starts in order of arrival, holds nobody back.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Literal

import pytest

from exod.runner.cpu import blas
from exod.wire import messages as m

blas.preload()  # before mlx, as in the runner
from exod.runner.load import Loaded  # noqa: E402
from exod.runner.serving import can_batch  # noqa: E402
from exod.runner.serving.batch_engine import BatchEngine  # noqa: E402
from tests.integration.whole_model import load_whole as load  # noqa: E402

ZOO: dict[str, dict[str, str]] = json.loads(os.environ.get("EXOD_TEST_ZOO_JSON", "{}"))
# Zoo families whose caches cannot be rewound, or are not plain: held back and brought back.
FAMILIES = ["mamba", "jamba", "gemma3_text", "olmo_hybrid", "qwen3_next"]
CHUNK = 64
EOS = 2  # the tiny and zoo models' end token, banned: every answer is max_tokens long
ids = itertools.count()


def ask(text: str, key: str, tokens: int, priority: Literal["interactive", "batch"]
        = "interactive", weight: float = 1.0, **kw: object) -> m.Generate:
    return m.Generate(id=f"{key}{next(ids)}", kind="completion", prompt=text, max_tokens=tokens,
                      temperature=0, logit_bias={str(EOS): -100}, key=key, weight=weight,
                      priority=priority, **kw)  # type: ignore[arg-type]


def reference(loaded: Loaded, req: m.Generate) -> str:
    """What in-process mlx-lm generates alone: greedy, the end token banned."""
    import mlx.core as mx
    from mlx_lm import stream_generate
    from mlx_lm.sample_utils import make_logits_processors

    assert req.prompt is not None
    return "".join(r.text for r in stream_generate(
        loaded.model, loaded.tokenizer, req.prompt, max_tokens=req.max_tokens,
        sampler=lambda x: mx.argmax(x, -1),
        logits_processors=make_logits_processors({EOS: -100.0})))


class Run:
    """An engine stepped until done, with what it sent: each request's text, the order of
    first tokens, and the step at which each was held back (a step whose rows lack it)."""

    def __init__(self, e: BatchEngine) -> None:
        self.e = e
        self.text: dict[str, str] = {}
        self.first: list[str] = []
        self.started: list[str] = []  # in the order the engine started them
        self.done: list[str] = []
        self.held: dict[str, int] = {}  # request -> steps it spent held back
        self.steps = 0

    def admit(self, *reqs: m.Generate) -> None:
        for r in reqs:
            self.text[r.id] = ""
            self.e.admit(r)
        self._starts()

    def _starts(self) -> None:
        entries = self.e.share.entries
        new = [rid for rid, e in entries.items() if e.running and rid not in self.started]
        self.started += sorted(new, key=lambda rid: entries[rid].started)

    def step(self) -> None:
        events = self.e.step()
        self._starts()
        for ev in events:
            assert not isinstance(ev, m.Error), ev
            if isinstance(ev, m.Text):
                if ev.id not in self.first:
                    self.first.append(ev.id)
                self.text[ev.id] += ev.reasoning + ev.text
            elif isinstance(ev, m.Done):
                self.done.append(ev.id)
        for rid, r in self.e._by_rid.items():
            if r.held is not None:
                self.held[rid] = self.held.get(rid, 0) + 1
        self.steps += 1

    def until(self, done: int) -> None:
        while len(self.done) < done:
            assert self.e.busy and self.steps < 5000
            self.step()

    def finish(self) -> None:
        while self.e.busy:
            assert self.steps < 5000
            self.step()
        assert sorted(self.done) == sorted(self.text), (self.done, list(self.text))


def engine(loaded: Loaded, width: int, fair: bool = True) -> BatchEngine:
    return BatchEngine(loaded.model, loaded.tokenizer, width=width, cache_bytes=0,
                       prefill_step=CHUNK, fair=fair)


def texts(n: int, words: int = 12) -> list[str]:
    return [" ".join(f"item {k} word {w}" for w in range(words)) for k in range(n)]


@pytest.fixture(scope="module")
def tiny() -> Loaded:
    return load(Path(os.environ["EXOD_TEST_TINY"]))


def test_a_full_batch_starts_the_key_least_served_next(tiny: Loaded) -> None:
    e = engine(tiny, width=2)
    run = Run(e)
    a = [ask(t, "a", tokens) for t, tokens in zip(texts(4), [6, 12, 6, 6], strict=True)]
    run.admit(*a)
    run.step()
    b = ask("a single chat from somebody else", "b", 6)
    run.admit(b)
    run.finish()
    # a's first two start at once; the row a[0] leaves goes to b, before a's two waiting.
    assert run.started == [a[0].id, a[1].id, b.id, a[2].id, a[3].id], run.started
    for r in [*a, b]:
        assert run.text[r.id] == reference(tiny, r), r.id
    assert not run.held


def test_first_come_first_served_starts_in_order_of_arrival(tiny: Loaded) -> None:
    e = engine(tiny, width=2, fair=False)
    run = Run(e)
    a = [ask(t, "a", 6) for t in texts(3)]
    run.admit(*a)
    run.step()
    b = ask("a single chat from somebody else", "b", 6)
    x = ask("work for the night", "x", 6, priority="batch")
    run.admit(x, b)
    run.finish()
    assert run.started == [a[0].id, a[1].id, a[2].id, x.id, b.id], run.started
    assert not run.held and e.serving().fair is False


def test_batch_work_is_held_back_for_interactive_work_with_its_tokens(tiny: Loaded) -> None:
    e = engine(tiny, width=2)
    run = Run(e)
    night = [ask(t, "night", 24, priority="batch", logprobs=True, top_logprobs=2)
             for t in texts(3)]
    run.admit(*night)
    for _ in range(6):  # both rows decoding
        run.step()
    assert len(run.first) == 2 and all(run.text[r.id] for r in night[:2])
    day = ask("a question from the day", "day", 8)
    run.admit(day)
    for _ in range(3):  # a row now: its prompt, its first token (mlx-lm samples ahead)
        run.step()
    assert day.id in run.first, run.first
    # Both rows yield the batch to the day's first token, then one comes back beside it.
    assert set(run.held) == {night[0].id, night[1].id} and night[2].id not in run.started
    run.step()
    back = [r.rid for r in e._by_uid.values() if r.rid != day.id]
    assert len(back) == 1 and day.id in e._by_rid, (back, run.done)
    run.finish()
    assert run.done.index(day.id) < 2, run.done  # before the night's work
    for r in [*night, day]:
        assert run.text[r.id] == reference(tiny, r), r.id
    s = e.serving()
    assert s.fair and s.active == 0


def test_batch_work_held_back_in_its_prompt_comes_back_from_where_it_was(tiny: Loaded) -> None:
    e = engine(tiny, width=1)
    run = Run(e)
    long = ask(texts(1, words=80)[0], "night", 8, priority="batch")  # several chunks
    run.admit(long)
    run.step()
    run.step()
    assert e._by_rid[long.id].in_cache >= CHUNK, e._by_rid[long.id]
    day = ask("a question from the day", "day", 6)
    run.admit(day)
    run.step()
    assert run.held == {long.id: 1}, run.held
    run.finish()
    assert run.first[0] == day.id and run.done == [day.id, long.id], run
    for r in (long, day):
        assert run.text[r.id] == reference(tiny, r), r.id
    # It went on from where it was held: its prompt through the model once.
    assert e._gen._counters.prompt_tokens < len(tiny.tokenizer.encode(long.prompt or "")) + 64


def test_interactive_work_is_never_held_back(tiny: Loaded) -> None:
    e = engine(tiny, width=2)
    run = Run(e)
    mine = [ask(t, "a", 12) for t in texts(2)]
    run.admit(*mine)
    run.step()
    other = ask("somebody else's chat", "b", 6)
    run.admit(other)
    run.until(2)
    run.finish()
    assert not run.held and run.done[:2] == [m.id for m in mine], run.done


def test_a_cancelled_request_held_back_leaves_nothing_behind(tiny: Loaded) -> None:
    e = engine(tiny, width=1)
    run = Run(e)
    night = ask(texts(1)[0], "night", 24, priority="batch")
    run.admit(night)
    for _ in range(4):
        run.step()
    day = ask("a question from the day", "day", 12)
    run.admit(day)
    run.step()
    assert night.id in run.held
    e.cancel(night.id)
    del run.text[night.id]
    run.finish()
    assert run.text[day.id] == reference(tiny, day)
    assert not e.share.entries and not e._by_rid


@pytest.mark.parametrize("name", FAMILIES)
def test_families_whose_caches_cannot_be_rewound_keep_their_tokens_held_back(
        name: str) -> None:
    if name not in ZOO:
        pytest.fail(f"{name} is not in the zoo")
    loaded = load(Path(ZOO[name]["path"]))
    assert can_batch.why_not(loaded.model) is None, name
    e = engine(loaded, width=1)
    run = Run(e)
    night = ask(texts(1, words=40)[0], "night", 10, priority="batch")
    run.admit(night)
    run.step()
    day = ask("a question from the day", "day", 6)
    run.admit(day)
    run.step()
    held = e._by_rid[night.id].held
    assert held is not None and 0 < len(held.tokens) < CHUNK * 2, (name, held)  # in its prompt
    run.until(1)
    while e._by_rid[night.id].completion_tokens < 3:
        run.step()
    later = ask("another question from the day", "day", 4)
    run.admit(later)
    run.step()
    held = e._by_rid[night.id].held
    assert held is not None and len(held.feed) == 1, (name, held)  # decoding: its next token
    run.finish()
    for r in (night, day, later):
        assert run.text[r.id] == reference(loaded, r), (name, r.id)
