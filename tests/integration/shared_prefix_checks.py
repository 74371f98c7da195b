"""Shared prefixes prefilled once (exod.runner.serving.shared_prefix) in the batch engine,
driven directly in this process on models loaded as a runner loads them. Run by
test_shared_prefix_engine.py in a pytest of its own (this imports mlx).

A burst of prompts that start alike: each request's text is what in-process mlx-lm generates
for it alone (greedy, its end token banned), the shared part goes through the model once
(mlx-lm's BatchGenerator counts the prompt tokens it prefilled), on the tiny model (plain KV
caches: a follower takes the leader's cache rewound to its shared part) and on every zoo family
whose caches cannot be rewound (a recurrent state, a sliding window: the leader's cache at the
last chunk boundary before it). Cancelling the leader fails no follower, a follower that joins
while the leader is half way through its prompt takes what the leader has, and a prefix on disk
after a restart is read once for the whole burst.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from pathlib import Path
import pytest

from exod.runner.cpu import blas
from exod.wire import messages as m

blas.preload()  # before mlx, as in the runner
from exod.runner.load import Loaded  # noqa: E402
from tests.integration.whole_model import load_whole  # noqa: E402
from exod.runner.prompt_cache import fingerprint as fp  # noqa: E402
from exod.runner.prompt_cache.disk import DiskTier  # noqa: E402
from exod.runner.serving import can_batch  # noqa: E402
from exod.runner.serving.batch_engine import BatchEngine  # noqa: E402
from exod.runner.serving.shared_prefix import common_prefix  # noqa: E402

ZOO: dict[str, dict[str, str]] = json.loads(os.environ.get("EXOD_TEST_ZOO_JSON", "{}"))
EOS = 2  # the tiny and zoo models' end token, banned: every answer is max_tokens long
CHUNK = 64  # the engines' prefill step here: prompts of a few hundred tokens span chunks
TOKENS = 6
ids = itertools.count()
# Families whose batch differs from mlx-lm alone whether or not a prefix is shared, and why.
UNLIKE_ALONE = {
    "plamo3": "mlx-lm's own BatchGenerator, prefilling in chunks of 64, answers other tokens "
              "than its generate for a prompt past the zoo's sliding window of 8 (chunks of 256 "
              "agree); exod prefills in such chunks too, shared or not",
}


load = load_whole


def prompts(loaded: Loaded, n: int, prefix: int) -> tuple[list[str], int]:
    """`n` prompts that start with the same text of about `prefix` tokens, then each its own
    question; and the tokens they share."""
    shared, words = "", itertools.count()
    while len(loaded.tokenizer.encode(shared)) < prefix:
        shared += f"Line {next(words)} of the shared system prompt says little. "
    texts = [f"{shared}Question {k}: which {'colour animal number city'.split()[k % 4]} "
             f"comes after {k * 7}?" for k in range(n)]
    tokens = [list(loaded.tokenizer.encode(t)) for t in texts]
    return texts, min(common_prefix(tokens[0], t) for t in tokens[1:])


def ask(text: str) -> m.Generate:
    return m.Generate(id=f"r{next(ids)}", kind="completion", prompt=text, max_tokens=TOKENS,
                      temperature=0, logit_bias={str(EOS): -100})


def length(loaded: Loaded, text: str) -> int:
    return len(loaded.tokenizer.encode(text))


def reference(loaded: Loaded, text: str) -> str:
    """What in-process mlx-lm generates alone: greedy, the end token banned."""
    import mlx.core as mx
    from mlx_lm import stream_generate
    from mlx_lm.sample_utils import make_logits_processors

    return "".join(r.text for r in stream_generate(
        loaded.model, loaded.tokenizer, text, max_tokens=TOKENS,
        sampler=lambda x: mx.argmax(x, -1),
        logits_processors=make_logits_processors({EOS: -100.0})))


def engine(loaded: Loaded, disk: DiskTier | None = None, width: int = 8) -> BatchEngine:
    return BatchEngine(loaded.model, loaded.tokenizer, width=width, cache_bytes=1 << 30,
                       prefill_step=CHUNK, disk=disk)


def finish(e: BatchEngine, reqs: list[m.Generate], cancel: str | None = None,
           after: int = 0) -> dict[str, str]:
    """Step until all are done: the text of each (by id). `cancel` at step `after`."""
    got: dict[str, str] = {r.id: "" for r in reqs}
    done: set[str] = set()
    steps = 0
    while e.busy:
        if cancel is not None and steps == after:
            e.cancel(cancel)
            done.add(cancel)
        for ev in e.step():
            assert not isinstance(ev, m.Error), ev
            if isinstance(ev, m.Text):
                got[ev.id] += ev.reasoning + ev.text
            elif isinstance(ev, m.Done):
                done.add(ev.id)
        steps += 1
    assert done == set(got), (done, set(got))
    return got


def burst(e: BatchEngine, texts: list[str], cancel_first_at: int | None = None
          ) -> tuple[list[m.Generate], dict[str, str]]:
    """`texts` admitted at once and stepped until done (the first cancelled at that step, if
    given): the requests and each one's text."""
    reqs = [ask(t) for t in texts]
    for r in reqs:
        e.admit(r)
    if cancel_first_at is None:
        return reqs, finish(e, reqs)
    return reqs, finish(e, reqs, cancel=reqs[0].id, after=cancel_first_at)


def solo(loaded: Loaded, reqs: list[m.Generate], texts: list[str], got: dict[str, str]
         ) -> list[bool]:
    """Whether each request's text is in-process mlx-lm's for its prompt alone."""
    return [got[r.id] == reference(loaded, p) for r, p in zip(reqs, texts, strict=True)]


def prefilled(e: BatchEngine, requests: int) -> int:
    """Prompt tokens mlx-lm's BatchGenerator put through the model since it was made, with
    each request's last (its counters count it as the first decode step's)."""
    return int(e._gen._counters.prompt_tokens) + requests


@pytest.fixture(scope="module")
def tiny() -> Loaded:
    return load(Path(os.environ["EXOD_TEST_TINY"]))


def test_a_burst_prefills_its_shared_prefix_once_with_each_solo_tokens(tiny: Loaded) -> None:
    texts, shared = prompts(tiny, 4, prefix=300)
    e = engine(tiny)
    reqs, got = burst(e, texts)
    assert all(solo(tiny, reqs, texts, got)), got
    s = e.serving()
    assert s.shared_hits == 3 and s.shared_tokens == 3 * shared, (s, shared)
    # The prefix once, and each prompt's own part (alone: every prompt whole).
    alone = sum(length(tiny, p) for p in texts)
    assert prefilled(e, 4) == alone - 3 * shared, (prefilled(e, 4), alone, shared)


def test_a_follower_that_joins_half_way_takes_what_the_leader_has(tiny: Loaded) -> None:
    (first, second), shared = prompts(tiny, 2, prefix=400)
    e = engine(tiny)
    lead = ask(first)
    e.admit(lead)
    for _ in range(3):  # three chunks of its prompt through the model
        e.step()
    late = ask(second)
    e.admit(late)
    got = finish(e, [lead, late])
    assert got[lead.id] == reference(tiny, first)
    assert got[late.id] == reference(tiny, second)
    assert e.serving().shared_tokens == shared
    assert prefilled(e, 2) == length(tiny, first) + length(tiny, second) - shared


def test_cancelling_the_leader_fails_no_follower(tiny: Loaded) -> None:
    texts, _ = prompts(tiny, 3, prefix=400)
    e = engine(tiny)
    reqs, got = burst(e, texts, cancel_first_at=2)  # half way through the shared part
    assert all(solo(tiny, reqs[1:], texts[1:], got)), got
    # One of the followers led the other through the rest of the prefix.
    assert e.serving().shared_hits == 1, e.serving()


def test_a_prefix_on_disk_is_read_once_for_a_burst(tiny: Loaded, tmp_path: Path) -> None:
    path = Path(os.environ["EXOD_TEST_TINY"])

    def tier() -> DiskTier:
        t = DiskTier(tmp_path, 0, 1 << 30)
        t.open({"format": fp.FORMAT_VERSION, "dtype": "float32"}, fp.weight_files(path, None))
        assert t.settled.wait(60) and t.writer.drain(time.monotonic() + 60), t.state
        return t

    texts, shared = prompts(tiny, 4, prefix=300)
    before = engine(tiny, tier())
    burst(before, texts[:1])
    before.save_cache(time.monotonic() + 60)
    after = engine(tiny, tier())  # a restart: nothing in RAM
    reqs, got = burst(after, texts)
    assert all(solo(tiny, reqs, texts, got)), got
    s = after.serving()
    assert s.disk_hits == 1 and s.shared_hits == 3, s


@pytest.mark.parametrize("name", sorted(ZOO))
def test_every_family_shares_a_burst_with_each_solo_tokens(name: str) -> None:
    loaded = load(Path(ZOO[name]["path"]))
    if can_batch.why_not(loaded.model) is not None:
        return  # served by turns: one request at a time, nothing in flight to share
    # A leader and one follower: what differs between families is how a cache is copied and
    # rewound, not how many follow (the tiny model's checks above take four).
    texts, shared = prompts(loaded, 2, prefix=300)
    e = engine(loaded)
    reqs, got = burst(e, texts)
    alike = solo(loaded, reqs, texts, got)
    assert all(alike) != (name in UNLIKE_ALONE), (name, alike)
    s = e.serving()
    assert s.shared_hits == 1, (name, s)
    # The shared part through the model once, but for at most a chunk for the follower.
    alone = sum(length(loaded, p) for p in texts)
    assert prefilled(e, 2) <= alone - (shared - CHUNK), (name, prefilled(e, 2), alone, shared)
