"""The vision engine (exod.runner.vision.engine.VisionEngine) driven directly, in this process,
on the vision zoo's models loaded as the runner loads them, against in-process mlx-vlm: each
request's tokens equal mlx-vlm `generate`'s for the same pictures and prompt, alone and in a
batch mixing pictures and text, in every family; the second turn about the same picture skips
the vision tower and keeps the tokens; a seed reproduces under batching; hostile pictures are
refused quickly, naming the part, while another request goes on; a cancel frees its slot
within a step. Run by test_vision_engine.py in a pytest of its own (this imports mlx); the zoo
comes from its environment (EXOD_TEST_VISION_ZOO)."""

from __future__ import annotations

import base64
import dataclasses
import io
import itertools
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from exod import messages as m
from exod.core.request_rules import RequestError
from exod.runner.cpu import blas

blas.preload()  # before mlx, as in the runner
from exod.runner.vision.engine import VisionEngine  # noqa: E402
from exod.runner.vision.load import LoadedVision, load_vision  # noqa: E402
from tests.models.vision_families import FAMILIES  # noqa: E402
from tests.models.vision_zoo import reference, picture  # noqa: E402
from tests.unit.test_vision_images import HOSTILE  # noqa: E402

PROMPT = "What is in the picture?"
N = 8
ids = itertools.count()


class Recording(VisionEngine):
    """The engine, recording each request's tokens as the generator gives them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tokens: dict[str, list[int]] = {}

    def _on_token(self, r: Any, resp: Any) -> list[m.Event]:
        self.tokens.setdefault(r.rid, []).append(resp.token)
        return super()._on_token(r, resp)


@pytest.fixture(scope="module")
def zoo() -> Path:
    return Path(os.environ["EXOD_TEST_VISION_ZOO"])


_loaded: dict[str, LoadedVision] = {}


def loaded(zoo: Path, family: str) -> LoadedVision:
    if family not in _loaded:
        _loaded[family] = load_vision(zoo / family, dtype="auto", progress=lambda i, n: None,
                                      should_stop=lambda: False)
    return _loaded[family]


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


def run(eng: VisionEngine, reqs: list[m.Generate], limit: int = 2000) -> dict[str, m.Event]:
    """Admit `reqs` at once and step until each has ended: id -> its Done or Error."""
    for req in reqs:
        eng.admit(req, eng.read(req))
    ends: dict[str, m.Event] = {}
    for _ in range(limit):
        for ev in eng.step():
            if isinstance(ev, (m.Done, m.Error)):
                ends[ev.id] = ev
        if all(req.id in ends for req in reqs):
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


def test_the_text_runner_refuses_pictures_naming_the_part() -> None:
    from exod.runner.serving.prepare import prompt_tokens

    with pytest.raises(RequestError) as info:
        prompt_tokens(None, ask([0]))
    assert info.value.param == "messages[0].content[0]"
    assert "does not see images" in str(info.value)
