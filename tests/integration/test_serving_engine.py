"""The serving engine through real runners, one daemon and the official openai client: what
only a daemon shows. Concurrent API requests are batched, each getting what it gets alone; a
long prompt's prefill can be cancelled by the client leaving or stopped between chunks (rung 1,
no signal), on one rank and in a group; the second turn of a chat hits the prompt cache and
`exoctl status` says so; a reload brings a new cache cap to the runner; streaming never splits a
character; tokens whose text is held back are progress. One daemon serves every test here, an
instance each, but the hang watch's (1 s: a daemon of its own, in the quiet phase). The
engine's own behaviour (batching token for token on the demo model, the prompt cache, eviction
by the byte cap, a cancel within a step) is checked on the engine directly: test_engine.py."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from tests.harness import EXOCTL, Daemon
from tests.integration.test_api_serving import RawStream, client

QUESTIONS = ["What is the capital of France?", "Count to five.", "Name a colour.", "Say hi.",
             "What is 2+2?", "Tell a joke about cats.", "Why is the sky blue?",
             "Write a haiku about rain."]
# ~6k tokens: minutes of prefill for the demo model on this CPU if it ran as one step.
LONG = "Please summarise the following text. " + "The quick brown fox jumps over it. " * 700
# ~5k tokens of the tiny model: tens of seconds of prefill through a 2-rank group on this CPU.
GROUP_LONG = "Please summarise the following text. " + "The quick brown fox jumps over it. " * 300


@pytest.fixture(scope="module")
def d(demo_model: Path, tiny_model: Path,
      tiny_model_factory: Callable[..., Path]) -> Iterator[Daemon]:
    """One daemon, an instance per test (each stops, reloads or counts only its own)."""
    demo, tiny, six = str(demo_model), str(tiny_model), str(tiny_model_factory(layers=6))
    group = {"model": six, "shards": 2}
    daemon = Daemon({"ready": "instances", "instances": {
        "batch": {"model": tiny, "max_concurrency": 4, "prompt_cache_bytes": 0},
        "cancel": {"model": demo},
        "stop": {"model": demo},  # default grace and drain
        "turns": {"model": tiny},
        "cap": {"model": tiny},
        "g-pipeline-stop": group,
        "g-tensor-stop": {**group, "parallelism": "tensor"},
        "g-cancel": group,
        "one": {"model": six},
        "pipe": group,
    }}, name="engine")
    try:
        daemon.start(wait_ready=False)
        daemon.wait_ready(timeout=600)  # 16 runners load at once: a bound only
        yield daemon
    finally:
        daemon.close()


def serving(d: Daemon, name: str) -> dict[str, Any]:
    s = d.instance(name)["serving"]
    assert s is not None, "the runner has not reported its engine yet"
    return dict(s)


def ask(d: Daemon, model: str, content: str, **kw: Any) -> str:
    r = client(d).chat.completions.create(
        model=model, messages=[{"role": "user", "content": content}], **kw)
    return r.choices[0].message.content or ""


def test_concurrent_requests_are_batched_each_getting_what_it_gets_alone(d: Daemon) -> None:
    """Through the API: four requests at once share the runner's batch (width 4), and each
    answer is the one it gets alone (token for token on the demo model, with seeds too:
    test_engine.py)."""
    greedy: dict[str, Any] = {"max_tokens": 12, "temperature": 0, "logit_bias": {"2": -100}}
    alone = [ask(d, "batch", q, **greedy) for q in QUESTIONS[:4]]
    assert serving(d, "batch")["width"] == 4
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda q: ask(d, "batch", q, **greedy), QUESTIONS[:4]))
    assert together == alone and all(alone)


def _long_prefill(d: Daemon, model: str, content: str = LONG) -> RawStream:
    """A streamed request whose prompt takes many prefill chunks; returns once it is running."""
    s = RawStream(d.api_url(), model=model, max_tokens=4,
                  messages=[{"role": "user", "content": content}])
    d.until_instance(model, lambda i: (i["serving"] or {}).get("active") == 1,
                     what="the long prompt to be in the batch")
    return s


def test_disconnect_during_prefill_frees_the_runner_within_a_chunk(d: Daemon) -> None:
    stream = _long_prefill(d, "cancel")
    left = time.monotonic()
    stream.close()
    # Generous bound: a few 256-token chunks on a loaded CPU; the whole prefill takes minutes.
    d.until_instance("cancel", lambda i: (i["serving"] or {}).get("active") == 0, timeout=60,
                     what="the cancelled prefill to leave the batch")
    freed = time.monotonic() - left
    assert serving(d, "cancel")["prompt_cache"]["entries"] == 0  # a cancel stores nothing
    assert ask(d, "cancel", "Say hi.", max_tokens=3, temperature=0)
    print(f"runner free {freed:.1f}s after the client left")


def test_stop_during_prefill_ends_at_rung_1_without_a_signal(d: Daemon) -> None:
    pid = d.instance("stop")["ranks"][0]["pid"]
    stream = _long_prefill(d, "stop")
    subprocess.run([*EXOCTL, "--socket", str(d.socket), "stop", "stop"], check=True,
                   capture_output=True, timeout=120)
    *_, last, done = stream.rest()
    assert done == b"[DONE]" and b"aborted" in last
    steps = [e["extra"]["step"] for e in d.events(event="ladder", instance="stop")]
    assert steps == ["ask"], f"must leave at rung 1, ladder: {steps}\n{d.log_text()}"
    (ex,) = d.events(event="exit", instance="stop")
    assert ex["extra"]["pid"] == pid and ex["extra"]["code"] == 0
    assert ex["extra"]["signals_sent"] == ["ask"] and ex["extra"]["signal"] is None


def test_second_turn_hits_the_prompt_cache_and_status_says_so(d: Daemon) -> None:
    c = client(d)
    turn1: list[Any] = [{"role": "user", "content": "What is the capital of France?"}]
    r1 = c.chat.completions.create(model="turns", messages=turn1, max_tokens=12, temperature=0)
    assert r1.usage is not None
    # The engine's figures follow the answer's last event on the channel: waited for.
    first = d.until_instance("turns", lambda i: i["serving"]["prompt_cache"]["entries"] == 1,
                             what="the first entry")["serving"]["prompt_cache"]
    assert first["entries"] == 1 and first["bytes"] > 0 and first["hits"] == 0

    turn2 = [*turn1, {"role": "assistant", "content": r1.choices[0].message.content},
             {"role": "user", "content": "And of Italy?"}]
    r2 = c.chat.completions.create(model="turns", messages=turn2, max_tokens=12, temperature=0)
    assert r2.usage is not None and r2.usage.prompt_tokens > r1.usage.prompt_tokens
    cache = d.until_instance("turns", lambda i: i["serving"]["prompt_cache"]["lookups"] == 2,
                             what="the second lookup")["serving"]["prompt_cache"]
    assert cache["lookups"] == 2 and cache["hits"] == 1 and cache["hit_rate"] == 0.5
    # At least the whole first prompt came from the cache, not from a prefill.
    assert cache["cached_tokens"] >= r1.usage.prompt_tokens
    table = d.ctl("status").stdout
    # The width: max_concurrency is unset, so memory admission sized it (exod.core.memory).
    width = d.instance("turns")["serving"]["width"]
    assert width >= 1 and f"turns: batch 0/{width}, prompt cache" in table
    assert "hit rate 50%" in table


def test_a_reloaded_cache_cap_reaches_the_runner_and_evicts(d: Daemon) -> None:
    """Learn one entry's size with the default cap, then reload with a cap of 1.5 entries:
    the instance restarts with it, and after three requests of the same size one entry is
    left, within the cap."""
    # logit_bias on the tiny model's end token: every answer has exactly max_tokens tokens.
    fixed: dict[str, Any] = {"max_tokens": 20, "temperature": 0, "logit_bias": {"2": -100}}
    prompts = ["apples and pears", "zebras in a field", "quiet morning rain"]
    ask(d, "cap", prompts[0], **fixed)
    one = d.until_instance("cap", lambda i: i["serving"]["prompt_cache"]["entries"] == 1,
                           what="the first entry")["serving"]["prompt_cache"]["bytes"]
    assert one > 0

    cap = one * 3 // 2
    config = yaml.safe_load(d.config_path.read_text())
    config["instances"]["cap"]["prompt_cache_bytes"] = cap
    d.write_config(config)
    d.ctl("reload")
    d.until_instance("cap", lambda i: i["state"] == "ready" and i["serving"] is not None
                     and i["serving"]["prompt_cache"]["max_bytes"] == cap,
                     what="cap to restart with the new cap")
    for p in prompts:
        ask(d, "cap", p, **fixed)
    cache = d.until_instance("cap", lambda i: i["serving"]["prompt_cache"]["lookups"] == 3,
                             what="the third lookup")["serving"]["prompt_cache"]
    assert cache["lookups"] == 3
    assert cache["entries"] == 1 and 0 < cache["bytes"] <= cap


def test_out_of_range_logit_bias_is_refused(d: Daemon) -> None:
    """Refused by the daemon, against the vocabulary rank 0 reported when it became ready
    (the runner checks again against the logits' real width: tests/unit/
    test_security_parts.py)."""
    try:
        ask(d, "batch", "hello", max_tokens=2, logit_bias={"1024": 5})
    except openai.BadRequestError as e:
        assert "outside the model's vocabulary" in str(e)
    else:
        raise AssertionError("a token id past the vocabulary must be refused")
    assert ask(d, "batch", "hello", max_tokens=2)  # and the runner serves on


# ---- a group (rank 0 drives the other ranks through one request at a time) -----------------
@pytest.mark.parametrize("parallelism", ["pipeline", "tensor"])
def test_group_stop_during_prefill_ends_at_rung_1_without_a_signal(
        d: Daemon, parallelism: str) -> None:
    """Rank 0 reads the prompt one chunk (one whole forward of the group) per step, so the
    stop is answered between two chunks: every rank leaves at rung 1 with exit code 0."""
    g = f"g-{parallelism}-stop"
    pids = [r["pid"] for r in d.instance(g)["ranks"]]
    stream = _long_prefill(d, g, GROUP_LONG)
    asked = time.monotonic()
    d.ctl("stop", g)
    *_, last, done = stream.rest()
    took = time.monotonic() - asked
    assert done == b"[DONE]" and b"aborted" in last
    steps = [e["extra"]["step"] for e in d.events(event="ladder", instance=g)]
    assert set(steps) == {"ask"}, f"must leave at rung 1, ladder: {steps}\n{d.log_text()}"
    exits = {e["extra"]["pid"]: e["extra"] for e in d.events(event="exit", instance=g)}
    assert set(exits) == set(pids), exits
    for ex in exits.values():
        assert ex["code"] == 0 and ex["signal"] is None and ex["signals_sent"] == ["ask"], ex
    print(f"group ({parallelism}) stopped {took:.1f}s after the ask, during its prefill")


def test_group_disconnect_during_prefill_frees_the_group(d: Daemon) -> None:
    stream = _long_prefill(d, "g-cancel", GROUP_LONG)
    left = time.monotonic()
    stream.close()
    # Generous: a chunk takes about a second on a loaded CPU; the whole prefill ~10x more.
    d.until_instance("g-cancel", lambda i: (i["serving"] or {}).get("active") == 0,
                     timeout=60, what="the cancelled prefill to leave")
    freed = time.monotonic() - left
    assert ask(d, "g-cancel", "Say hi.", max_tokens=3, temperature=0, logit_bias={"2": -100})
    assert d.instance("g-cancel")["state"] == "ready"
    print(f"group free {freed:.1f}s after the client left")


# ---- streaming never splits a character ------------------------------------------------------
# The tiny model's byte-level BPE has a token per byte: "Ã" is byte 0xC3 (the lead byte of "é"),
# "©" is 0xA9 (its continuation). With only those two allowed, an "é" in the answer always spans
# two tokens; a lead byte not followed by its continuation is invalid and decodes to U+FFFD.
LEAD, CONT = "130", "105"


def test_multibyte_characters_are_never_split_across_chunks(d: Daemon) -> None:
    """Sampled (a seed: the same tokens every time) between the two bytes of "é": every "é" was
    two tokens. Streamed on one rank (BatchEngine) and on a 2-rank group (TurnEngine), the chunks
    join into the non-streamed answer, and no chunk holds half a character (it would show as
    U+FFFD in the stream, where the whole answer has "é")."""
    kw: dict[str, Any] = {"messages": [{"role": "user", "content": "Say hi."}],
                          "max_tokens": 60, "temperature": 2.0, "seed": 7,
                          "logit_bias": {LEAD: 100, CONT: 100}}
    answers = []
    for name in ("one", "pipe"):
        whole = client(d).chat.completions.create(model=name, **kw)
        answer = whole.choices[0].message.content or ""
        assert whole.usage is not None and whole.usage.completion_tokens == 60
        chunks = [c.choices[0].delta.content
                  for c in client(d).chat.completions.create(model=name, stream=True, **kw)
                  if c.choices and c.choices[0].delta.content]
        assert answer.count("é") >= 3, f"the case must occur: {answer!r}"
        assert "".join(chunks) == answer, (chunks, answer)
        assert len(chunks) > answer.count("é"), chunks  # streamed in pieces, not at the end
        assert all(set(c) <= {"é", "\ufffd"} for c in chunks), chunks
        answers.append(answer)
    assert answers[0] == answers[1]  # a seed reproduces across engines too


@pytest.mark.timing  # a 1 s hang watch: a daemon of its own, in the quiet phase
def test_tokens_whose_text_is_held_back_are_progress_not_a_hang(
        daemons: Callable[..., Daemon], tiny_model: Path) -> None:
    """A generation whose tokens show no text for a while (text that may still turn out to
    be a stop sequence: the stop matcher holds it) is generating all the same: the hang watch
    must not restart the instance (it did, after `hang_after`, with every event being text).
    Each token is a lone continuation byte, shown as U+FFFD at once (exod.runner.serving.
    detokenize), and the stop sequence is a run of U+FFFD longer than the answer gets while
    the watch runs, so nothing is shown for over a second."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
    byte = next(i for i in range(256, tok.get_vocab_size())
                if tok.decode([i]) == "\ufffd")  # a lone continuation byte
    d = daemons({"ready": "instances", "instances": {"held": {
        "model": str(tiny_model), "hang_after": "1s"}}})
    d.start()
    pid = d.instance("held")["ranks"][0]["pid"]
    t0 = time.monotonic()
    first = None
    finish = None
    for chunk in client(d).completions.create(
            model="held", prompt="hello", max_tokens=1500, temperature=0, stream=True,
            logit_bias={str(byte): 100}, stop=["\ufffd" * 1023 + "X"]):
        if chunk.choices and chunk.choices[0].text and first is None:
            first = time.monotonic() - t0
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    assert finish == "length"
    inst = d.instance("held")
    assert inst["restarts"] == 0 and inst["ranks"][0]["pid"] == pid
    assert first is not None and first > 1.0, \
        f"the first text came after {first}s: too soon to show the hang watch"
