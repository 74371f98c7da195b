"""The prompt cache's disk tier in the batch engine (exod.runner.serving.batch_engine with
exod.runner.prompt_cache), driven directly in this process on models loaded as a runner loads
them. Run by test_prompt_cache_engine.py in a pytest of its own (this imports mlx).

A restart here is a new engine over a new disk tier on the same folder, as a new runner makes
them: for every family of the zoo (EXOD_TEST_ZOO, the JSON `tests.models.zoo` prints), the same
prompt after it is loaded from disk and gives the same greedy tokens as its cold prefill, or
the family is one of the documented misses (MISSES). Then, on the tiny model (EXOD_TEST_TINY):
a stop or a cancel during a load ends it within a step and keeps the file, a corrupt file is a
miss then served with the cold tokens, a warm prompt is prefilled once, then found, and an entry
evicted from RAM goes to disk while requests are served past its held-up write, and the stop's
flush ends by its deadline, dropping what a held-up writer did not write; in a group (its
agreement stood in for), a miss on another rank is no hit on rank 0, even after a whole load.
An agent's next turn while its last entry is still being written (a rank alone) starts from that
entry with the cold tokens, and an entry bigger than both the RAM tier and the writer's queue
(an agent's prompt on a real model) is still written, and serves the next turn.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from pathlib import Path

import pytest

from exod.wire import messages as m
from exod.runner.cpu import blas

blas.preload()  # before mlx, as in the runner
from exod.runner.load import Loaded  # noqa: E402
from tests.integration.whole_model import load_whole  # noqa: E402
from exod.runner.prompt_cache import fingerprint as fp  # noqa: E402
from exod.runner.prompt_cache.disk import DiskTier  # noqa: E402
from exod.runner.serving import can_batch, disk_loads  # noqa: E402
from exod.runner.serving.batch_engine import BatchEngine  # noqa: E402

ZOO: dict[str, dict[str, str]] = json.loads(os.environ.get("EXOD_TEST_ZOO_JSON", "{}"))
# Families whose prompt cache is a miss, and why (docs/prompt-cache.md; docs/models.md).
MISSES: dict[str, str] = {
    # Served by turns (exod.runner.serving.can_batch): mlx-lm's turn path keeps no prompt
    # cache, in RAM or on disk.
    "deepseek_v41": "its LayerCache cannot be batched: served by turns, with no prompt cache",
    "llama4": "its ChunkedKVCache cannot be batched: served by turns, with no prompt cache",
    "nemotron-nas": "it leaves some caches empty, which a batch cannot hold: served by turns, "
                    "with no prompt cache",
    # Their attention cannot take the mask of rows of different lengths (exod.runner.serving.
    # can_batch): served by turns, with no prompt cache.
    "gemma2": "a batch's padding mask does not broadcast against its queries: served by turns",
    "phi3small": "a batch's padding mask does not broadcast against its queries: served by "
                 "turns",
    "gpt_bigcode": "it reads a batch's per-row offset as one number: served by turns",
}
PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n" * 3 + "def main():\n    return"
EOS = 2
ids = itertools.count()


load = load_whole


def disk(root: Path, model: Path, **kw: int | bool) -> DiskTier:
    """A disk tier opened as a runner opens it (the same parts make the same fingerprint);
    `kw`: DiskTier's options (max_queued, solo)."""
    tier = DiskTier(root, 0, 1 << 30, **kw)  # type: ignore[arg-type]
    tier.open({"format": fp.FORMAT_VERSION, "dtype": "float32"}, fp.weight_files(model, None))
    assert tier.settled.wait(60) and tier.writer.drain(time.monotonic() + 60), tier.state
    assert tier.ready, tier.state
    return tier


def engine(loaded: Loaded, tier: DiskTier) -> BatchEngine:
    return BatchEngine(loaded.model, loaded.tokenizer, width=2, cache_bytes=1 << 30, disk=tier)


def ask(prompt: str = PROMPT, max_tokens: int = 5) -> m.Generate:
    return m.Generate(id=f"r{next(ids)}", kind="completion", prompt=prompt,
                      max_tokens=max_tokens, temperature=0, logit_bias={str(EOS): -100})


def run(e: BatchEngine, req: m.Generate) -> tuple[str, m.Done]:
    e.admit(req)
    text, done = "", None
    while e.busy:
        for ev in e.step():
            assert not isinstance(ev, m.Error), ev
            if isinstance(ev, m.Text):
                text += ev.text
            elif isinstance(ev, m.Done):
                done = ev
    assert done is not None
    return text, done


def kept(e: BatchEngine) -> None:
    """The stop's flush: everything in RAM to disk."""
    e.save_cache(time.monotonic() + 60)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_every_family_hits_after_a_restart_with_the_cold_tokens(name: str,
                                                                tmp_path: Path) -> None:
    path = Path(ZOO[name]["path"])
    loaded = load(path)
    why = can_batch.why_not(loaded.model)
    if why is not None:  # served by turns: no prompt cache at all
        assert name in MISSES, f"{name}: not batched ({why}), and not a documented miss"
        return
    before = engine(loaded, disk(tmp_path, path))
    cold, first = run(before, ask())
    kept(before)
    after = engine(loaded, disk(tmp_path, path))  # a restart: nothing in RAM
    warm, again = run(after, ask())
    s = after.serving()
    if name in MISSES:
        assert s.disk_hits == 0, f"{name} hits although documented as a miss"
        return
    assert s.disk_hits == 1 and s.disk_entries >= 1, s
    assert again.cached_tokens == first.prompt_tokens - 1, (again, first)
    assert warm == cold, (warm, cold)


@pytest.fixture(scope="module")
def tiny() -> Loaded:
    return load(Path(os.environ["EXOD_TEST_TINY"]))


def restarted(tiny: Loaded, root: Path) -> tuple[str, BatchEngine]:
    """The cold answer, then an engine after a restart whose disk holds the prompt."""
    first = engine(tiny, disk(root, Path(os.environ["EXOD_TEST_TINY"])))
    cold, _ = run(first, ask())
    kept(first)
    return cold, engine(tiny, disk(root, Path(os.environ["EXOD_TEST_TINY"])))


@pytest.mark.parametrize("end", ["stop", "cancel"])
def test_a_stop_or_a_cancel_during_a_load_ends_it_within_a_step(
        tiny: Loaded, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, end: str) -> None:
    cold, e = restarted(tiny, tmp_path)
    monkeypatch.setattr(disk_loads, "LOAD_STEP", 1)  # an array a step: the load takes many
    req = ask()
    e.admit(req)
    steps = 0
    while not any(r.load and r.load.done for r in e._by_rid.values()):  # read under way
        assert not [ev for ev in e.step() if isinstance(ev, (m.Error, m.Text))]
        steps += 1
        assert steps < 1000, "the load never started"
    load = e._by_rid[req.id].load
    assert load is not None and not load.ready and load.arrays, "the load ended in one step"
    if end == "stop":
        events = e.abort_prefilling("aborted", "stopping")
        assert [type(ev) for ev in events] == [m.Error]
    else:
        e.cancel(req.id)
    assert not e.busy and e.step() == []
    monkeypatch.undo()
    text, done = run(e, ask())  # the file was left as it was: the next one loads it
    assert text == cold and done.cached_tokens > 0 and e.serving().disk_hits == 1


def test_a_corrupt_entry_is_a_miss_then_served_with_the_cold_tokens(
        tiny: Loaded, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    cold, e = restarted(tiny, tmp_path)
    tier = e.cache.disk
    assert tier is not None and tier.folder is not None
    (entry,) = [p for p in tier.folder.iterdir()]  # noqa: C416
    raw = bytearray(entry.read_bytes())
    raw[-100] ^= 0xFF  # in the data: the header still reads
    entry.write_bytes(bytes(raw))
    text, done = run(e, ask())
    assert text == cold and done.cached_tokens == 0
    s = e.serving()
    assert s.disk_hits == 0 and s.disk_errors == 1
    assert tier.writer.drain(time.monotonic() + 30) and not entry.exists()
    assert capfd.readouterr().err.count("does not match its CRC") == 1


def test_a_warm_prompt_is_prefilled_once_then_found(tiny: Loaded, tmp_path: Path) -> None:
    path = Path(os.environ["EXOD_TEST_TINY"])
    tokens = tiny.tokenizer.encode(PROMPT)
    first = engine(tiny, disk(tmp_path, path))
    assert first.warm(tokens) and first.background and first.active == 0
    while first.busy:
        assert first.step() == []  # a warm-up says nothing to anyone
    assert not first.warm(tokens)  # held now
    kept(first)
    after = engine(tiny, disk(tmp_path, path))
    assert not after.warm(tokens)  # held on disk: nothing to prefill at this start
    _, done = run(after, ask(PROMPT + " x"))
    assert done.cached_tokens >= len(tokens) - 1 and after.serving().disk_hits == 1



def test_an_entry_out_of_ram_goes_to_disk_and_no_request_waits_for_its_write(
        tiny: Loaded, tmp_path: Path) -> None:
    """A RAM tier too small for any entry evicts each one as it is kept: to the disk's writer,
    which is held up here by a job that waits. Requests are served meanwhile (none waits for
    the write); once the writer goes on, the entry is on disk and a restart loads it."""
    import threading

    path = Path(os.environ["EXOD_TEST_TINY"])
    tier = disk(tmp_path, path)
    e = BatchEngine(tiny.model, tiny.tokenizer, width=2, cache_bytes=1, disk=tier)
    gate, held = threading.Event(), threading.Event()
    tier.writer.submit(lambda: (held.set(), gate.wait(120)) and None)
    assert held.wait(30)
    try:
        cold, first = run(e, ask())
        other, _ = run(e, ask(PROMPT + " # another"))  # served while the first write waits
        assert not gate.is_set() and not tier.writer.idle  # the write has not happened yet
        s = e.serving()
        assert (s.cache_entries, s.disk_entries, s.disk_writes) == (0, 0, 0), s
    finally:
        gate.set()
    assert tier.writer.drain(time.monotonic() + 60)
    assert e.serving().disk_writes == 2
    after = engine(tiny, disk(tmp_path, path))  # a restart: nothing in RAM
    warm, again = run(after, ask())
    assert warm == cold and again.cached_tokens == first.prompt_tokens - 1
    assert after.serving().disk_hits == 1


def test_the_stop_s_flush_ends_by_its_deadline_and_drops_what_is_not_written(
        tiny: Loaded, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Rung 1's flush with the writer held up (a slow disk): it returns by its deadline, says
    what it dropped, and the dropped write never happens (the ladder never waits for it)."""
    import threading

    tier = disk(tmp_path, Path(os.environ["EXOD_TEST_TINY"]))
    e = engine(tiny, tier)
    run(e, ask())  # kept in RAM, not yet on disk (the engine was never idle)
    gate, held = threading.Event(), threading.Event()
    tier.writer.submit(lambda: (held.set(), gate.wait(120)) and None)
    assert held.wait(30)
    try:
        t = time.monotonic()
        e.save_cache(t + 0.3)
        took = time.monotonic() - t
        assert 0.3 <= took < 5, took  # waited for the deadline, then no longer
    finally:
        gate.set()
    assert tier.writer.drain(time.monotonic() + 60)
    assert e.serving().disk_writes == 0 and not list(tmp_path.glob("rank0/*/*.safetensors"))
    assert "1 entry not written to disk before the stop's deadline (dropped)" in \
        capfd.readouterr().err


def test_a_whole_load_on_rank_0_is_no_hit_when_another_rank_could_not_load_its_part(
        tiny: Loaded, tmp_path: Path) -> None:
    """A group's agreement stood in for: the other rank is slower, then fails, so rank 0's own
    load is whole by the time the group agrees on a miss. The request starts from nothing with
    the cold tokens, and rank 0 counts no hit (it did, when its own load was whole first)."""
    path = Path(os.environ["EXOD_TEST_TINY"])
    first = engine(tiny, disk(tmp_path, path))
    cold, _ = run(first, ask())
    kept(first)

    def agree(flags: list[bool]) -> list[bool]:
        n = len(flags) // 2
        ready, ok = flags[:n], flags[n:]
        return [False] * n + ([False] * n if all(ready) else ok)

    after = BatchEngine(tiny.model, tiny.tokenizer, width=2, cache_bytes=1 << 30,
                        disk=disk(tmp_path, path), agree=agree)
    text, done = run(after, ask())
    s = after.serving()
    assert text == cold and done.cached_tokens == 0
    assert (s.disk_hits, s.disk_cached_tokens) == (0, 0), s


TURN = PROMPT + "\n# the tool said: 42\n"  # the next turn of a chat: PROMPT, then more


def cold_answer(tiny: Loaded, prompt: str) -> str:
    """`prompt`'s answer from an engine with no prompt cache at all."""
    text, done = run(BatchEngine(tiny.model, tiny.tokenizer, width=2, cache_bytes=0), ask(prompt))
    assert done.cached_tokens == 0
    return text


def test_the_next_turn_starts_from_an_entry_still_being_written(
        tiny: Loaded, tmp_path: Path) -> None:
    """A rank alone (`solo`): an entry evicted from RAM waits for the writer, held up here (a
    slow disk, or gigabytes to write); the next turn, meanwhile, starts from it (its arrays are
    in memory until written) with the cold tokens. Once written it is on disk, and out of
    memory."""
    import threading

    tier = disk(tmp_path, Path(os.environ["EXOD_TEST_TINY"]), solo=True)
    e = BatchEngine(tiny.model, tiny.tokenizer, width=2, cache_bytes=1, disk=tier)
    gate, held = threading.Event(), threading.Event()
    tier.writer.submit(lambda: (held.set(), gate.wait(120)) and None)
    assert held.wait(30)
    try:
        _, first = run(e, ask())
        text, turn = run(e, ask(TURN))
        assert not gate.is_set() and e.serving().disk_writes == 0  # nothing written yet
    finally:
        gate.set()
    assert turn.cached_tokens >= first.prompt_tokens - 1, (turn, first)
    assert text == cold_answer(tiny, TURN)
    assert tier.writer.drain(time.monotonic() + 60)
    _, again = run(e, ask(TURN))  # from disk now: the writes are over
    assert again.cached_tokens >= turn.prompt_tokens - 1 and e.serving().disk_hits == 1
    assert not len(e.cache.writing)


def test_an_entry_bigger_than_ram_and_the_write_queue_still_serves_the_next_turn(
        tiny: Loaded, tmp_path: Path) -> None:
    """An agent's prompt on a real model is one KV cache of gigabytes, bigger than the RAM tier
    (1 GiB by default) and the writer's queue bound (as big): it was kept nowhere, and every
    turn was prefilled whole. Stood in for by bounds below one entry: the writer takes it when
    it has nothing else, the next turn starts from it with the cold tokens, and a restart
    finds it on disk."""
    path = Path(os.environ["EXOD_TEST_TINY"])
    e = BatchEngine(tiny.model, tiny.tokenizer, width=2, cache_bytes=1,
                    disk=disk(tmp_path, path, max_queued=1, solo=True))
    _, first = run(e, ask())
    text, turn = run(e, ask(TURN))
    assert turn.cached_tokens >= first.prompt_tokens - 1, (turn, first)
    assert text == cold_answer(tiny, TURN)
    kept(e)
    after = BatchEngine(tiny.model, tiny.tokenizer, width=2, cache_bytes=1,
                        disk=disk(tmp_path, path, max_queued=1, solo=True))
    _, again = run(after, ask(TURN))
    assert again.cached_tokens >= turn.prompt_tokens - 1 and after.serving().disk_hits == 1
