"""The vision engine (exod.runner.vision.engine.VisionEngine) driven directly, in this process,
on the vision zoo's models loaded as the runner loads them, against in-process mlx-vlm: each
request's tokens equal mlx-vlm `generate`'s for the same pictures and prompt, alone and in a
batch mixing pictures and text, in every family; the second turn about the same picture skips
the vision tower and keeps the tokens; a seed reproduces under batching; a forced tool call and
a JSON schema hold with pictures, and reasoning is the template's and kept apart; hostile
pictures are refused quickly, naming the part, while another request goes on; a cancel frees
its slot within a step; a stop (the ladder's first rung) ends the requests still being seen or
prefilled and lets the decoding ones finish; the tower loads block by block with progress. Run
by test_vision_engine.py in a pytest of its own (this imports mlx); the zoo comes from its
environment (EXOD_TEST_VISION_ZOO)."""

from __future__ import annotations

import base64
import dataclasses
import io
import itertools
import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from exod.wire import messages as m
from exod.core.request_rules import RequestError
from exod.runner.cpu import blas

blas.preload()  # before mlx, as in the runner
from exod.runner.vision.engine import VisionEngine  # noqa: E402
from exod.runner.failures import LoadAborted  # noqa: E402
from exod.runner.vision.load import LoadedVision, load_vision, tower_blocks  # noqa: E402
from tests.models.added_tokens import copy_with_tokens  # noqa: E402
from tests.models.thinking import OPEN_BLOCK, THINK  # noqa: E402
from tests.models.vision_families import FAMILIES, chatml, chatml_tools  # noqa: E402
from tests.models.vision_zoo import make_vision_model, picture, reference  # noqa: E402
from tests.unit.test_vision_images import HOSTILE  # noqa: E402

PROMPT = "What is in the picture?"
N = 8
ids = itertools.count()


class Recording(VisionEngine):
    """The engine, recording each request's tokens as the generator gives them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tokens: dict[str, list[int]] = {}
        self.steps = 0
        self.firsts: dict[str, int] = {}  # the step of each one's first token

    def step(self) -> list[m.Event]:
        self.steps += 1
        return super().step()

    def _on_token(self, r: Any, resp: Any) -> list[m.Event]:
        self.tokens.setdefault(r.rid, []).append(resp.token)
        self.firsts.setdefault(r.rid, self.steps)
        return super()._on_token(r, resp)


@pytest.fixture(scope="module")
def zoo() -> Path:
    return Path(os.environ["EXOD_TEST_VISION_ZOO"])


_loaded: dict[Path, LoadedVision] = {}


def loaded(zoo: Path, family: str) -> LoadedVision:
    if zoo / family not in _loaded:
        _loaded[zoo / family] = load_vision(zoo / family, dtype="auto",
                                            progress=lambda i, n: None,
                                            should_stop=lambda: False)
    return _loaded[zoo / family]


def engine(zoo: Path, family: str, width: int = 4, **kw: Any) -> Recording:
    lv = loaded(zoo, family)
    return Recording(lv.model, lv.processor, lv.tokenizer, width=width, prefill_step=32, **kw)


def png(img: Any) -> m.Image:
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return m.Image(base64.b64encode(buf.getvalue()).decode())


def ask(seeds: list[int], prompt: str = PROMPT, **kw: Any) -> m.Generate:
    """A user's message showing the pictures of `seeds`, then `prompt` (text alone without)."""
    parts = [{"type": "image", "image": i} for i in range(len(seeds))]
    content: Any = [*parts, {"type": "text", "text": prompt}] if seeds else prompt
    return m.Generate(id=f"r{next(ids)}", kind="chat", max_tokens=kw.pop("max_tokens", N),
                      temperature=kw.pop("temperature", 0.0),
                      images=[png(picture(seed=s)) for s in seeds],
                      messages=[{"role": "user", "content": content}], **kw)


def run(eng: VisionEngine, reqs: list[m.Generate], limit: int = 2000,
        until: list[str] | None = None) -> dict[str, m.Event]:
    """Admit `reqs` at once and step until each (or each of `until`'s ids) has ended: id -> its
    Done or Error."""
    for req in reqs:
        eng.admit(req, eng.read(req))
    ends: dict[str, m.Event] = {}
    wanted = until if until is not None else [req.id for req in reqs]
    for _ in range(limit):
        for ev in eng.step():
            if isinstance(ev, (m.Done, m.Error)):
                ends[ev.id] = ev
        if all(rid in ends for rid in wanted):
            return ends
    raise AssertionError(f"not done after {limit} steps: {sorted(ends)}")


CASES = [[0], [], [5], [3, 4]]  # the pictures of each request of the batch (none: text)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_tokens_equal_mlx_vlm_generate_alone_and_in_a_mixed_batch(zoo: Path,
                                                                   family: str) -> None:
    refs = [reference(zoo / family, PROMPT, [picture(seed=s) for s in seeds], N)
            for seeds in CASES]
    alone = engine(zoo, family, width=1)
    req = ask(CASES[0])
    run(alone, [req])
    assert alone.tokens[req.id] == refs[0]["tokens"]
    batch = engine(zoo, family, width=4)
    reqs = [ask(seeds) for seeds in CASES]
    ends = run(batch, reqs)
    for req, ref in zip(reqs, refs, strict=True):
        done = ends[req.id]
        assert isinstance(done, m.Done), done
        assert batch.tokens[req.id] == ref["tokens"], (req.id, batch.tokens, refs)
        assert done.prompt_tokens == ref["prompt_tokens"]


@pytest.mark.parametrize("family", ["qwen2_5_vl", "llava"])
def test_the_second_turn_about_the_same_picture_skips_the_tower(zoo: Path,
                                                               family: str) -> None:
    eng = engine(zoo, family)
    first = ask([1])
    run(eng, [first])
    assert first.messages is not None
    second = m.Generate(id="second", kind="chat", max_tokens=N, temperature=0.0,
                        images=[png(picture(seed=1))], messages=[
                            first.messages[0], {"role": "assistant", "content": "A picture."},
                            {"role": "user", "content": "And its colour?"}])
    run(eng, [second])
    assert (eng.features.lookups, eng.features.hits, len(eng.features)) == (2, 1, 1)
    fresh = engine(zoo, family, feature_bytes=0)  # the tower runs again: the same tokens
    again = dataclasses.replace(second, id="again")
    run(fresh, [again])
    assert fresh.tokens["again"] == eng.tokens[second.id]
    assert fresh.features.lookups == 0


def follow_up(first: m.Generate, rid: str, seeds: list[int], prompt: str,
              answer: str = "A picture.") -> m.Generate:
    """The next turn after `first` and its `answer`: a user's message showing the pictures of
    `seeds` (besides `first`'s), then `prompt`."""
    assert first.messages is not None
    parts: list[Any] = [{"type": "image", "image": len(first.images) + i}
                        for i in range(len(seeds))]
    content: Any = [*parts, {"type": "text", "text": prompt}] if seeds else prompt
    return m.Generate(id=rid, kind="chat", max_tokens=N, temperature=0.0,
                      images=[*first.images, *(png(picture(seed=s)) for s in seeds)],
                      messages=[*first.messages, {"role": "assistant", "content": answer},
                                {"role": "user", "content": content}])


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_next_turn_about_the_same_picture_starts_from_the_prompt_cache(
        zoo: Path, tmp_path_factory: pytest.TempPathFactory, family: str) -> None:
    """The first turn's prompt and answer are in the cache: the second (the answer sent back as
    it came) prefills the rest only, runs no tower, and gives the tokens of an engine without
    any cache. Gemma 3's sliding layers keep a window of 8 tokens in the zoo, too few to take
    back the random answer's last tokens (which the text sent back does not spell the same
    way): here its window is 64, as a real one holds a turn (1024)."""
    if family == "gemma3":
        zoo = tmp_path_factory.mktemp("wide")
        make_vision_model(zoo / family, family, overrides={"text_config/sliding_window": 64})
    eng = engine(zoo, family, cache_bytes=64 << 20)
    first = ask([1])
    run(eng, [first])
    runs = eng.features.runs
    answer = eng.tokenizer.decode(eng.tokens[first.id])
    second = follow_up(first, "second", [], "And its colour?", answer)
    ends = run(eng, [second])
    done = ends["second"]
    assert isinstance(done, m.Done), done
    assert done.cached_tokens >= ends_first(eng, first) > 0, (done, family)
    assert eng.features.runs == runs  # the picture's tower output came from its cache
    cold = engine(zoo, family, feature_bytes=0)
    again = dataclasses.replace(second, id="cold")
    run(cold, [again])
    assert cold.tokens["cold"] == eng.tokens["second"], family


def ends_first(eng: Recording, first: m.Generate) -> int:
    """Tokens of the first turn's prompt (all of them in the second's, and cached)."""
    return len(eng.read(first).tokens)


def test_another_picture_shares_no_cached_prefix_past_its_first_placeholder(zoo: Path) -> None:
    eng = engine(zoo, "qwen2_5_vl", cache_bytes=64 << 20)
    first = ask([1])
    run(eng, [first])
    other = ask([2])
    ends = run(eng, [other])
    done = ends[other.id]
    assert isinstance(done, m.Done)
    tokens = eng.read(other).tokens
    first_placeholder = min(i for i, t in enumerate(tokens) if t in eng.placeholders)
    assert 0 < done.cached_tokens <= first_placeholder
    fresh = engine(zoo, "qwen2_5_vl")
    again = dataclasses.replace(other, id="fresh")
    run(fresh, [again])
    assert fresh.tokens["fresh"] == eng.tokens[other.id]


def test_the_next_turn_from_the_cache_joins_new_pictures_decoding(zoo: Path) -> None:
    """A request prefilled from the prompt cache (a batch of its own) joins a decoding batch of
    new pictures (cold: seen while the cache was empty), each with the tokens it has alone: the
    warm one once made the batch's next filter fail (its thinking-budget list one entry short),
    ending every request in it."""
    eng = engine(zoo, "qwen2_5_vl", cache_bytes=64 << 20)
    first = ask([1])
    news = [ask([5], max_tokens=4 * N), ask([6], max_tokens=4 * N)]
    ends = run(eng, [first, *news], until=[first.id])
    answer = eng.tokenizer.decode(eng.tokens[first.id])
    second = follow_up(first, "second", [], "And its colour?", answer)
    ends |= run(eng, [second], until=[second.id, *(r.id for r in news)])
    assert all(isinstance(ends[r.id], m.Done) for r in [second, *news]), ends
    assert ends["second"].cached_tokens >= ends_first(eng, first) > 0  # type: ignore[union-attr]
    solo = engine(zoo, "qwen2_5_vl", width=1)
    for r in [second, *news]:
        run(solo, [dataclasses.replace(r, id=f"solo-{r.id}")])
        assert solo.tokens[f"solo-{r.id}"] == eng.tokens[r.id], r.id


def test_a_burst_is_prefilled_together_and_decodes_from_one_step(zoo: Path) -> None:
    """Requests that come together, while nothing decodes, are all seen before the generator
    steps: one prompt batch, every first token in the same step. The chat template's opening,
    cached from an earlier request, is not taken (under half of each prompt, others waiting):
    a warm prompt would prefill alone, the others after it."""
    eng = engine(zoo, "qwen2_5_vl", width=4, cache_bytes=64 << 20)
    run(eng, [ask([1])])
    reqs = [ask([s]) for s in (2, 3, 4, 5)]
    for req in reqs:
        eng.admit(req, eng.read(req))
    first: dict[str, int] = {}  # the step of each one's first token
    for step in range(200):
        eng.step()
        first |= {r.id: step for r in reqs if r.id in eng.tokens and r.id not in first}
        if all(len(eng.tokens.get(r.id, [])) == N for r in reqs):
            break
    assert len(first) == len(reqs) and len(set(first.values())) == 1, first
    assert eng.cache_hits == 0, eng.cache_hits
    alone = engine(zoo, "qwen2_5_vl", width=1)
    for r in reqs:
        run(alone, [dataclasses.replace(r, id=f"alone-{r.id}")])
        assert alone.tokens[f"alone-{r.id}"] == eng.tokens[r.id], r.id


def first_steps(eng: Recording, reqs: list[m.Generate]) -> dict[str, int]:
    """The step of each one's first token (the engine's steps, counted from 1)."""
    return {r.id: eng.firsts[r.id] for r in reqs if r.id in eng.firsts}


def test_a_burst_seen_while_another_decodes_is_prefilled_together(zoo: Path) -> None:
    """Requests that come together while another decodes are seen one per step, between its
    decode steps, and held until the last is seen: one prompt batch, every first token in the
    same step (put into the generator as each was seen, they were prefilled in batches of one
    to three, each joining the decoding batch steps after the one before)."""
    eng = engine(zoo, "qwen2_5_vl", width=8)
    decoding = ask([1], max_tokens=8 * N)
    eng.admit(decoding, eng.read(decoding))
    while decoding.id not in eng.tokens:
        eng.step()
    reqs = [ask([s]) for s in (2, 3, 4, 5, 6)]
    ends = run(eng, reqs)
    assert all(isinstance(ends[r.id], m.Done) for r in reqs), ends
    firsts = first_steps(eng, reqs)
    assert len(set(firsts.values())) == 1, firsts
    assert len(eng.tokens[decoding.id]) < 8 * N  # it decoded all along


class Gated(Recording):
    """Reads every request but the first only once the first has been seen (on the reader's
    thread, as the runner reads): a burst whose first request is seen while the others are
    still being read, as through the daemon. Stops its life once every request has N tokens."""

    def __init__(self, *args: Any, life: Any, ids: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.life, self.ids = life, ids
        self.first_seen = threading.Event()

    def read(self, req: m.Generate) -> Any:
        if req.id != self.ids[0]:
            assert self.first_seen.wait(60), "the first request was never seen"
        return super().read(req)

    def see_next(self) -> list[m.Event]:
        events = super().see_next()
        if any(e.id == self.ids[0] for e in events):
            self.first_seen.set()
        return events

    def _on_token(self, r: Any, resp: Any) -> list[m.Event]:
        events = super()._on_token(r, resp)
        if all(len(self.tokens.get(rid, [])) == N for rid in self.ids):
            self.life.request_stop("the burst is answered")
        return events


def test_the_serve_loop_holds_a_burst_s_first_request_for_the_ones_being_read(
        zoo: Path) -> None:
    """Through the serve loop (exod.runner.serving.loop, its reader's thread real), a burst
    whose first request is seen while the others are still being read: it is held for them
    (the loop waits for the reads), and the burst is prefilled in one prompt batch, every
    first token in the same step. Put into the generator at once, the first was prefilled
    alone and the others after it."""
    from exod.runner.link.channel import Channel
    from exod.runner.link.lifecycle import Lifecycle
    from exod.runner.link.report import Reporter
    from exod.runner.serving.loop import ServeLoop

    life = Lifecycle()
    channel = Channel(None, life)  # no daemon: what the loop sends is dropped
    reqs = [ask([s]) for s in (2, 3, 4, 5)]
    lv = loaded(zoo, "qwen2_5_vl")
    eng = Gated(lv.model, lv.processor, lv.tokenizer, width=8, prefill_step=32, life=life,
                ids=[r.id for r in reqs])
    for req in reqs:
        channel.inbox.put(req)
    watchdog = threading.Timer(120, life.request_stop, ["the burst took over 120 s"])
    watchdog.start()
    try:
        ServeLoop(eng, channel, life, Reporter(channel), heartbeat_every=1.0).run()
    finally:
        watchdog.cancel()
    assert life.reason == "the burst is answered", life.reason
    firsts = first_steps(eng, reqs)
    assert len(firsts) == len(reqs) and len(set(firsts.values())) == 1, firsts


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl", "gemma3", "llava", "mistral3"])
def test_a_new_picture_beside_a_seen_one_runs_the_tower_on_the_new_one_only(
        zoo: Path, family: str) -> None:
    eng = engine(zoo, family)
    first = ask([1])
    run(eng, [first])
    second = follow_up(first, "second", [4], "And this one?")
    run(eng, [second])
    assert (eng.features.lookups, eng.features.hits, len(eng.features)) == (3, 1, 2)
    # Each picture's output is the one the tower gives it alone (the tower is not exactly
    # batch-invariant: run on both together, the last bits may differ): seen alone first, then
    # both from the cache, they give the same tokens.
    alone = engine(zoo, family)
    run(alone, [ask([1])])
    run(alone, [ask([4])])
    runs = alone.features.runs
    run(alone, [dataclasses.replace(second, id="alone")])
    assert alone.features.runs == runs
    assert alone.tokens["alone"] == eng.tokens["second"], family
    both = engine(zoo, family)  # both pictures new: one call, kept per picture
    run(both, [dataclasses.replace(second, id="both")])
    assert (both.features.runs, len(both.features)) == (1, 2)
    run(both, [dataclasses.replace(second, id="both again")])
    assert both.features.runs == 1 and both.tokens["both again"] == both.tokens["both"]


def test_logprobs_are_the_distribution_each_token_was_drawn_from(zoo: Path) -> None:
    eng = engine(zoo, "qwen2_5_vl")
    greedy = ask([0], logprobs=True, top_logprobs=3)
    sampled = ask([0], temperature=1.5, seed=3, logprobs=True, top_logprobs=3)
    plain = ask([0])
    texts: dict[str, list[m.TokenLogprob]] = {}
    for req in (greedy, sampled, plain):
        eng.admit(req, eng.read(req))
    ends: dict[str, m.Event] = {}
    while len(ends) < 3:
        for ev in eng.step():
            if isinstance(ev, m.Text):
                texts.setdefault(ev.id, []).extend(ev.logprobs)
            elif isinstance(ev, (m.Done, m.Error)):
                ends[ev.id] = ev
    assert eng.tokens[greedy.id] == eng.tokens[plain.id]  # asking changes no token
    assert not texts.get(plain.id)
    for rid in (greedy.id, sampled.id):
        got = texts[rid]
        assert len(got) == N, (rid, len(got))
        for entry in got:
            assert len(entry.top) == 3
            tops = [t.logprob for t in entry.top]
            assert tops == sorted(tops, reverse=True) and tops[0] < 0.0
            assert entry.logprob <= tops[0]
    # Greedy: each token is the most probable one; sampled: the draw shows its probability,
    # not the one-hot the generator was handed (a logprob of 0 for every token).
    assert all(e.logprob == e.top[0].logprob for e in texts[greedy.id])
    assert any(e.logprob < e.top[0].logprob for e in texts[sampled.id])


def test_a_seed_reproduces_alone_and_in_a_batch(zoo: Path) -> None:
    eng = engine(zoo, "qwen2_5_vl")
    alone = ask([2], temperature=1.5, seed=7, max_tokens=12)
    run(eng, [alone])
    together = [ask([2], temperature=1.5, seed=7, max_tokens=12), ask([6]), ask([]),
                ask([2], temperature=1.5, seed=8, max_tokens=12)]
    run(eng, together)
    assert eng.tokens[together[0].id] == eng.tokens[alone.id]
    assert eng.tokens[together[3].id] != eng.tokens[alone.id]  # another seed, another draw
    greedy = engine(zoo, "qwen2_5_vl")
    g = ask([2], max_tokens=12)
    run(greedy, [g])
    assert greedy.tokens[g.id] != eng.tokens[alone.id]  # the draw is not the greedy pick


def test_hostile_pictures_are_refused_quickly_while_another_request_goes_on(
        zoo: Path) -> None:
    eng = engine(zoo, "qwen2_5_vl")
    good = ask([0], max_tokens=24)
    eng.admit(good, eng.read(good))
    refusals: dict[str, tuple[float, RequestError | None]] = {}

    def read_all() -> None:  # the reader's thread, as in the serve loop
        for what, make, _ in HOSTILE:
            req = m.Generate(id=what, kind="chat", max_tokens=4,
                             images=[m.Image(base64.b64encode(make()).decode())],
                             messages=[{"role": "user", "content": [
                                 {"type": "text", "text": PROMPT},
                                 {"type": "image", "image": 0}]}])
            t0 = time.monotonic()
            try:
                eng.read(req)
                refusals[what] = (time.monotonic() - t0, None)
            except RequestError as e:
                refusals[what] = (time.monotonic() - t0, e)

    reader = threading.Thread(target=read_all)
    reader.start()
    ends: dict[str, m.Event] = {}
    while good.id not in ends:
        ends.update({ev.id: ev for ev in eng.step() if isinstance(ev, (m.Done, m.Error))})
    reader.join(60)
    assert isinstance(ends[good.id], m.Done) and len(eng.tokens[good.id]) == 24
    assert sorted(refusals) == sorted(h[0] for h in HOSTILE)
    for what, (seconds, error) in refusals.items():
        assert error is not None, f"{what} was read as a picture"
        assert error.param == "messages[0].content[1]", (what, error.param)
        assert "the image cannot be used" in str(error), str(error)
        assert seconds < 3.0, (what, seconds)


def test_a_cancel_frees_the_slot_within_a_step(zoo: Path) -> None:
    eng = engine(zoo, "gemma3", width=2)
    long = ask([0], "describe " * 600, max_tokens=4)  # ~1,200 tokens: dozens of chunks
    waiting = ask([1], max_tokens=4)
    eng.admit(long, eng.read(long))
    eng.admit(waiting, eng.read(waiting))
    for _ in range(3):
        eng.step()
    assert eng.active == 2
    eng.cancel(long.id)  # in its prefill
    assert eng.active == 1
    after = ask([2], max_tokens=4)
    ends = run(eng, [after])
    assert isinstance(ends[after.id], m.Done) and eng.active == 0
    assert long.id not in eng.tokens
    queued = ask([3])
    eng.admit(queued, eng.read(queued))
    eng.cancel(queued.id)  # before its pictures were seen
    assert eng.active == 0 and eng.step() == []


def test_an_engine_alone_keeps_nothing_of_its_requests_but_the_cache_it_clears(zoo: Path) -> None:
    """A runner alone kept each request's tokens and embeddings for a group's ranks that do not
    exist (~12 KB a picture: the soak's picture runner grew for an hour). Once served, nothing of
    a request is held but the prompt cache's entry."""
    eng = engine(zoo, "qwen2_5_vl", cache_bytes=64 << 20)
    for _ in range(2):
        ends = run(eng, [ask([0], f"Picture {i}?") for i in range(3)] + [ask([], "Text?")])
        assert all(isinstance(e, m.Done) for e in ends.values()), ends
    assert eng.shipped == [] and eng.active == 0
    assert not (eng._by_uid or eng._by_rid or eng._ended or eng._waiting or eng._held)
    assert eng.cache_entries >= 4  # what it keeps on purpose
    eng.clear_cache()  # exoctl cache clear
    assert eng.cache_entries == 0


def test_the_text_runner_refuses_pictures_naming_the_part() -> None:
    from exod.runner.serving.prepare import prompt_tokens

    with pytest.raises(RequestError) as info:
        prompt_tokens(None, ask([0]))
    assert info.value.param == "messages[0].content[0]"
    assert "does not see images" in str(info.value)


FORECAST = {"type": "object", "properties": {
    "unit": {"enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 14}},
    "required": ["unit", "days"], "additionalProperties": False}
ANSWER = {"type": "object", "properties": {
    "ok": {"type": "boolean"}, "kind": {"enum": ["cat", "dog", "other"]}},
    "required": ["ok", "kind"], "additionalProperties": False}


def with_tools(zoo: Path, family: str, out: Path) -> Path:
    """A copy of the zoo's `family` whose chat template takes tools (chatml_tools)."""
    shutil.copytree(zoo / family, out, ignore=shutil.ignore_patterns(".exod-*"))
    path = out / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["chat_template"] = chatml_tools(FAMILIES[family].marker)
    path.write_text(json.dumps(config))
    return out


def test_a_forced_tool_call_and_a_json_schema_hold_with_pictures_in_a_batch(
        zoo: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Constrained decoding and tool calls are the text runner's (exod.runner.serving): with
    pictures, batched beside a plain request, a forced call comes out as a ToolCall whose
    arguments follow the tool's parameters, and a response_format's answer its schema; the
    plain request keeps its solo tokens."""
    import jsonschema

    lv = load_vision(with_tools(zoo, "qwen2_5_vl", tmp_path_factory.mktemp("tools") / "m"),
                     dtype="auto", progress=lambda i, n: None, should_stop=lambda: False)
    tools = [{"type": "function", "function": {"name": "forecast", "parameters": FORECAST}}]
    call = ask([0], tools=tools, tool_choice="required", max_tokens=120)
    fmt = ask([1], response_format={"type": "json_schema", "schema": ANSWER}, max_tokens=120)
    plain = ask([2])
    solo = Recording(lv.model, lv.processor, lv.tokenizer, width=4, prefill_step=32)
    run(solo, [dataclasses.replace(plain, id="solo")])
    eng = Recording(lv.model, lv.processor, lv.tokenizer, width=4, prefill_step=32)
    reqs = [call, fmt, plain]
    for req in reqs:
        eng.admit(req, eng.read(req))
    calls: list[m.ToolCall] = []
    texts: dict[str, str] = {}
    ends: dict[str, m.Event] = {}
    for _ in range(2000):
        for ev in eng.step():
            if isinstance(ev, m.ToolCall):
                calls.append(ev)
            elif isinstance(ev, m.Text):
                texts[ev.id] = texts.get(ev.id, "") + ev.text
            elif isinstance(ev, (m.Done, m.Error)):
                ends[ev.id] = ev
        if len(ends) == len(reqs):
            break
    assert all(isinstance(ends[r.id], m.Done) for r in reqs), ends
    done = ends[call.id]
    assert isinstance(done, m.Done) and done.finish_reason == "tool_calls", done
    (made,) = calls
    assert made.id == call.id and made.name == "forecast"
    jsonschema.validate(json.loads(made.arguments), FORECAST)
    jsonschema.validate(json.loads(texts[fmt.id]), ANSWER)
    assert eng.tokens[plain.id] == solo.tokens["solo"]


def test_a_stop_ends_what_is_seen_or_prefilled_and_lets_the_decoding_finish(zoo: Path) -> None:
    """The ladder's first rung (the serve loop's abort_prefilling): a request whose pictures
    are not seen yet and one in its prefill end with the stop's error at once; the one already
    decoding goes on to its last token, as it would have alone."""
    solo = engine(zoo, "qwen2_5_vl")
    alone = ask([0], max_tokens=12)
    run(solo, [alone])
    eng = engine(zoo, "qwen2_5_vl")
    decoding = dataclasses.replace(alone, id="decoding")
    eng.admit(decoding, eng.read(decoding))
    while not eng.tokens.get(decoding.id):
        eng.step()
    long = ask([1], "describe " * 600, max_tokens=4)  # ~1,200 tokens: dozens of chunks
    eng.admit(long, eng.read(long))
    eng.step()  # seen, its first chunk prefilled
    unseen = ask([2, 3])
    eng.admit(unseen, eng.read(unseen))
    stopped = eng.abort_prefilling("stopping", "the instance is stopping")
    assert sorted(ev.id for ev in stopped) == sorted([long.id, unseen.id])
    assert all(isinstance(ev, m.Error) and ev.code == "stopping" for ev in stopped), stopped
    assert eng.active == 1
    ends: dict[str, m.Event] = {}
    while decoding.id not in ends:
        ends.update({ev.id: ev for ev in eng.step() if isinstance(ev, (m.Done, m.Error))})
    assert isinstance(ends[decoding.id], m.Done) and set(ends) == {decoding.id}
    assert eng.tokens[decoding.id] == solo.tokens[alone.id]
    assert long.id not in eng.tokens and eng.active == 0


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_tower_loads_block_by_block_with_progress_and_a_stop_between(zoo: Path,
                                                                        family: str) -> None:
    """The tower's blocks (2 in the zoo, found by tower_blocks in every family) are steps of
    the load's progress before the language model's 4; a stop asked for after the tower's first
    block ends the load there."""
    steps: list[tuple[int, int]] = []
    lv = load_vision(zoo / family, dtype="auto", progress=lambda i, n: steps.append((i, n)),
                     should_stop=lambda: False)
    assert steps == [(i, 6) for i in range(7)], (family, steps)
    tower = tower_blocks(lv.model)
    assert len(tower) == 2 and len({type(b) for b in tower}) == 1, tower
    asked: list[int] = []
    with pytest.raises(LoadAborted):
        load_vision(zoo / family, dtype="auto", progress=lambda i, n: asked.append(i),
                    should_stop=lambda: bool(asked) and asked[-1] >= 1)
    assert asked == [0, 1], asked


def test_reasoning_with_pictures_is_the_template_s_and_kept_apart(
        zoo: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """A model whose template opens a think block (as Qwen3-VL's; its tokenizer knows the
    markers): by the template's own default a request with a picture thinks (its random text
    is all reasoning, counted as such), and `enable_thinking: false` gets the answer alone;
    beside each other in one batch."""
    generation = "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    template = chatml(FAMILIES["qwen2_5_vl"].marker)
    assert template.endswith(generation)
    thinking = (template[:-len(generation)] + "{% if add_generation_prompt %}"
                "{{ '<|im_start|>assistant\\n' }}" + OPEN_BLOCK + "{% endif %}")

    def edit(folder: Path) -> None:
        path = folder / "tokenizer_config.json"
        config = json.loads(path.read_text())
        config["chat_template"] = thinking
        path.write_text(json.dumps(config))
    out = tmp_path_factory.mktemp("thinking") / "m"
    copy_with_tokens(zoo / "qwen2_5_vl", out, THINK, edit=edit)
    lv = load_vision(out, dtype="auto", progress=lambda i, n: None, should_stop=lambda: False)
    eng = Recording(lv.model, lv.processor, lv.tokenizer, width=4, prefill_step=32)
    thinks = ask([0])
    answers = ask([0], chat_template_kwargs={"enable_thinking": False})
    for req in (thinks, answers):
        eng.admit(req, eng.read(req))
    said: dict[str, tuple[str, str]] = {}
    ends: dict[str, m.Event] = {}
    while len(ends) < 2:
        for ev in eng.step():
            if isinstance(ev, m.Text):
                text, reasoning = said.get(ev.id, ("", ""))
                said[ev.id] = (text + ev.text, reasoning + ev.reasoning)
            elif isinstance(ev, (m.Done, m.Error)):
                ends[ev.id] = ev
    done, plain = ends[thinks.id], ends[answers.id]
    assert isinstance(done, m.Done) and isinstance(plain, m.Done), ends
    assert said[thinks.id][0] == "" and said[thinks.id][1], said
    assert done.reasoning_tokens == done.completion_tokens == N
    assert said[answers.id][0] and said[answers.id][1] == "", said
    assert plain.reasoning_tokens == 0
