"""Hostile and careless clients against one rank and 2-rank groups (pipeline, tensor), which
batch with a plan sent from rank 0 to the other ranks every step (exod.runner.group.lockstep).

The model is the zoo's gpt2: its positions are a learned table of `n_positions` rows (512 here),
so a position past the context window would index outside that table (mlx does not check
indices: an out-of-bounds read, or a crash). Every bad request must get a 4xx naming its field,
never a 500, and must leave the group in step: the same greedy text afterwards, no rank
restarted."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from tests.harness import ONE_PIXEL_PNG, Daemon
from tests.integration.conftest import double_env
from tests.integration.test_security import Api, tracebacks
from tests.zoo import make_zoo

LAYOUTS: dict[str, dict[str, Any]] = {
    "one": {},
    "pp": {"shards": 2},
    "tp": {"shards": 2, "parallelism": "tensor"},
}
WINDOW = 512  # the zoo gpt2's n_positions
EOS = "2"
GREEDY: dict[str, Any] = {"max_tokens": 16, "temperature": 0, "logit_bias": {EOS: -100}}
HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    zoo = make_zoo(tmp_path_factory.mktemp("zoo"), ["gpt2"])
    model = zoo["gpt2"]["path"]
    d = Daemon({"instances": {
        name: {"model": model, "max_concurrency": 8,
               "backoff": {"initial": "100ms", "jitter": 0}, **extra}
        for name, extra in LAYOUTS.items()}}, name="hostile")
    try:
        d.start()
        for name in LAYOUTS:
            d.until_instance(name, lambda i: i["state"] == "ready" and i["serving"] is not None,
                             what=f"{name} ready, with its engine's figures")
        yield d
    finally:
        d.close()


def client(d: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=d.api_url() + "/v1", api_key="-", max_retries=0, timeout=120)


def ranks(d: Daemon, name: str) -> tuple[int, list[int]]:
    """(restarts, pids): what must not change under a bad request."""
    inst = d.instance(name)
    return inst["restarts"], [r["pid"] for r in inst["ranks"]]


def greedy(d: Daemon, name: str, content: str = "Say hi.") -> str:
    r = client(d).chat.completions.create(
        model=name, messages=[{"role": "user", "content": content}], **GREEDY)
    return r.choices[0].message.content or ""


def words(n: int) -> str:
    """About 3n tokens of the zoo's tokenizer."""
    return "hello " * n


def refused(api: Api, body: dict[str, Any], param: str,
            path: str = "/v1/chat/completions") -> str:
    status, answer = api.post(body, path, token=None)
    assert status == 400, (body, status, answer)
    assert answer["error"]["param"] == param, answer
    return str(answer["error"]["message"])


# ---- fields checked against the model ------------------------------------------------------
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_a_prompt_past_the_context_window_is_refused(hostile: Daemon, name: str) -> None:
    d, api = hostile, Api(hostile)
    before = ranks(d, name)
    text = greedy(d, name)
    why = refused(api, {"model": name, "prompt": words(200), "max_tokens": 1}, "prompt",
                  "/v1/completions")
    assert f"maximum context length is {WINDOW} tokens" in why, why
    refused(api, {"model": name, "messages": [{"role": "user", "content": words(200)}]},
            "messages")
    # Streamed too: a 400 before the stream starts, not a 200 whose stream ends in an error.
    with pytest.raises(openai.BadRequestError) as e:
        client(d).chat.completions.create(
            model=name, messages=[{"role": "user", "content": words(200)}], stream=True)
    assert e.value.param == "messages"  # type: ignore[attr-defined]
    # A prompt that fits, with room for fewer tokens than asked: generation ends at the window.
    r = client(d).completions.create(model=name, prompt=words(160), max_tokens=100,
                                     temperature=0, logit_bias={EOS: -100})
    assert r.usage is not None and r.usage.prompt_tokens + r.usage.completion_tokens == WINDOW
    assert r.choices[0].finish_reason == "length"
    assert greedy(d, name) == text
    assert ranks(d, name) == before
    assert tracebacks(d) == []


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_a_temperature_or_top_p_near_zero_is_greedy(hostile: Daemon, name: str) -> None:
    """1 / temperature overflows float32 below ~3e-39: the logits became NaN and the sampler
    drew anything."""
    text = greedy(d := hostile, name)
    for t in (1e-30, 1e-45, 5e-324):
        r = client(d).chat.completions.create(
            model=name, messages=[{"role": "user", "content": "Say hi."}], seed=7,
            **{**GREEDY, "temperature": t})
        assert r.choices[0].message.content == text, t
    # top_p keeps the fewest tokens whose probabilities reach it: at 0, the most probable one.
    # 0 used to turn top_p off, so the least random setting drew from the whole vocabulary.
    for top_p in (1e-9, 0):
        r = client(d).chat.completions.create(
            model=name, messages=[{"role": "user", "content": "Say hi."}], seed=7,
            **{**GREEDY, "temperature": 1.5, "top_p": top_p})
        assert r.choices[0].message.content == text, top_p


def test_max_tokens_fields_and_n(hostile: Daemon) -> None:
    d, api = hostile, Api(hostile)
    # A client that sends every field, unset ones as null: max_tokens still counts.
    status, answer = api.post({"model": "one", "messages": HELLO, "max_completion_tokens": None,
                               "max_tokens": 2, "logit_bias": {EOS: -100}}, token=None)
    assert status == 200 and answer["usage"]["completion_tokens"] == 2, answer
    refused(api, {"model": "one", "messages": HELLO, "max_completion_tokens": 2,
                  "max_tokens": -5}, "max_tokens")
    for n in (True, 1.0, 2, 0):
        refused(api, {"model": "one", "messages": HELLO, "n": n}, "n")
    refused(api, {"model": "one", "prompt": ""}, "prompt", "/v1/completions")
    assert tracebacks(d) == []


# ---- a batch under attack ------------------------------------------------------------------
BAD: list[tuple[str, dict[str, Any], str]] = [
    ("/v1/completions", {"prompt": words(200)}, "prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": words(200)}]},
     "messages"),
    ("/v1/completions", {"prompt": ""}, "prompt"),
    ("/v1/chat/completions", {"messages": HELLO, "logit_bias": {"1024": 1}}, "logit_bias"),
    ("/v1/chat/completions", {"messages": HELLO, "logit_bias": {"5": float("inf")}},
     "logit_bias"),
    # (A max_tokens past the window is clamped, not refused: issue 27.)
    ("/v1/chat/completions", {"messages": HELLO, "max_tokens": 2.5}, "max_tokens"),
    ("/v1/chat/completions", {"messages": HELLO, "max_tokens": 0}, "max_tokens"),
    ("/v1/chat/completions", {"messages": HELLO, "seed": 1.5}, "seed"),
    ("/v1/chat/completions", {"messages": HELLO, "stop": [""]}, "stop"),
    ("/v1/chat/completions", {"messages": HELLO, "temperature": -1}, "temperature"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{ONE_PIXEL_PNG}"}}]}]},
     "messages[0].content[0]"),
    ("/v1/chat/completions", {"messages": HELLO, "n": 3}, "n"),
]


async def _stream(session: aiohttp.ClientSession, url: str, body: dict[str, Any],
                  leave_after: int | None = None) -> str:
    """The text of a stream; with `leave_after`, the client leaves after that many chunks."""
    text, chunks = [], 0
    async with session.post(url + "/v1/chat/completions", json={**body, "stream": True}) as r:
        assert r.status == 200, await r.text()
        async for line in r.content:
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[6:])
            assert "error" not in event, event
            if piece := event["choices"][0]["delta"].get("content"):
                text.append(piece)
                chunks += 1
                if leave_after is not None and chunks >= leave_after:
                    break
    return "".join(text)


async def _bad(session: aiohttp.ClientSession, url: str, name: str) -> list[tuple[int, Any]]:
    out = []
    for path, body, _ in BAD:
        async with session.post(url + path, json={"model": name, **body}) as r:
            out.append((r.status, (await r.json())["error"]["param"]))
    return out


async def _attack(url: str, name: str, questions: list[str]) -> tuple[list[str], Any]:
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        good = [asyncio.create_task(_stream(session, url, {
            "model": name, "messages": [{"role": "user", "content": q}], **GREEDY}))
            for q in questions]
        long = {"model": name, "messages": [{"role": "user", "content": words(150)}],
                "max_tokens": 50}
        # Clients that leave during their prompt (cancelled once the batch runs) and during
        # their answer.
        in_prefill = [asyncio.create_task(_stream(session, url, long)) for _ in range(3)]
        in_decode = [asyncio.create_task(_stream(session, url, {
            "model": name, "messages": HELLO, "max_tokens": 400, "logit_bias": {EOS: -100}},
            leave_after=3)) for _ in range(3)]
        bad = await _bad(session, url, name)
        for task in in_prefill:
            task.cancel()
        texts = await asyncio.gather(*good)
        await asyncio.gather(*in_decode)
    return texts, bad


@pytest.mark.parametrize("name", ["pp", "tp"])
def test_bad_requests_and_leavers_mid_batch_leave_the_group_in_step(
        hostile: Daemon, name: str) -> None:
    d = hostile
    before = ranks(d, name)
    questions = ["Say hi.", "Count to five.", "Name a colour."]
    alone = [greedy(d, name, q) for q in questions]
    texts, bad = asyncio.run(_attack(d.api_url(), name, questions))
    assert bad == [(400, param) for _, _, param in BAD]
    assert texts == alone  # the batch's other requests never noticed
    d.until_instance(name, lambda i: i["serving"]["active"] == 0,
                     what="every request out of the batch")
    assert [greedy(d, name, q) for q in questions] == alone
    assert ranks(d, name) == before
    assert tracebacks(d) == []


def test_a_body_too_large_for_the_runner_channel_is_refused(
        daemons: Any, tiny_model: Path) -> None:
    """A runner takes frames of 64 MiB at most; api.max_body_kib may allow more. Such a
    request broke the runner's channel, and the runner restarted."""
    d = daemons({"api": {"listen": "127.0.0.1:0", "max_body_kib": 70 * 1024},
                 "instances": {"tiny": {"model": str(tiny_model)}}}, name="hostile")
    d.start()
    d.until_state("tiny", "ready")
    before = ranks(d, "tiny")
    api = Api(d)
    body = json.dumps({"model": "tiny", "prompt": "a" * (65 << 20), "max_tokens": 1}).encode()
    status, _, answer = api.request("POST", "/v1/completions", body, token=None)
    assert status == 413, answer[:300]
    assert json.loads(answer)["error"]["param"] == "prompt"
    assert ranks(d, "tiny") == before
    assert client(d).completions.create(model="tiny", prompt="hi", max_tokens=2).usage
    assert tracebacks(d) == []


def test_a_long_read_is_neither_a_hang_nor_a_lost_peer(daemons: Any, tiny_model: Path) -> None:
    """A runner tokenizes a request before it can work on it: seconds, for a body of
    megabytes (refused after, as past the window), during which it sent nothing. With a short
    hang_after the daemon took that for a hung runner, and with a short peer_timeout the other
    rank of a group took it for a lost rank 0: either way, a restart."""
    short = {"hang_after": "2s", "peer_timeout": "2s"}
    d = daemons({"api": {"listen": "127.0.0.1:0", "max_body_kib": 8192},
                 "instances": {"one": {"model": str(tiny_model), **short},
                               "g": {"model": str(tiny_model), "shards": 2, **short}}},
                name="hostile")
    d.start()
    for name in ("one", "g"):
        d.until_state(name, "ready")
        before = ranks(d, name)
        status, answer = Api(d).post({"model": name, "prompt": words(1_300_000),
                                      "max_tokens": 1}, "/v1/completions", token=None,
                                     timeout=120)  # megabytes read under the suite's load
        assert status == 400 and answer["error"]["param"] == "prompt", answer
        assert ranks(d, name) == before
        assert client(d).completions.create(model=name, prompt="hi", max_tokens=2).usage
        assert ranks(d, name) == before


def _stream_times(c: openai.OpenAI, name: str, over: threading.Event,
                  started: threading.Event, out: list[float]) -> None:
    """Stream a long answer, recording when each chunk comes, until `over`."""
    with c.chat.completions.create(model=name, messages=HELLO, max_tokens=4000,
                                   temperature=0, stream=True, logit_bias={EOS: -100}) as st:
        for _ in st:
            out.append(time.monotonic())
            if len(out) == 10:
                started.set()
            if over.is_set():
                break


def test_a_long_read_stands_neither_the_batch_nor_a_stop_still(daemons: Any,
                                                                tiny_model: Path) -> None:
    """A request is read (chat template, tokenizer, checks: seconds for megabytes) on a thread
    of the runner's own. Read between two steps of the batch, it stood every stream still for
    as long, and a stop waited for it: with a grace shorter than the read, SIGTERM."""
    d = daemons({"api": {"listen": "127.0.0.1:0", "max_body_kib": 8192},
                 "instances": {"one": {"model": str(tiny_model), "stop": {"grace": "1s"}}}},
                name="hostile")
    d.start()
    pid = d.until_state("one", "ready")["ranks"][0]["pid"]
    # 6 MB: read in ~6 s beside a stream of the tiny model on a quiet machine, more under load
    # (its loop is mostly Python, so the two threads share the GIL). 1.8 MB once took several
    # seconds; since the runners' kernels were built for the CPU's instructions
    # (exod.runner.cpu.jit_flags) it took 1.7-2.7 s, too short for the check below.
    body = {"model": "one", "prompt": words(1_000_000), "max_tokens": 1}
    c = client(d)

    # 1. A stream goes on while another request is read.
    times: list[float] = []
    started, over = threading.Event(), threading.Event()
    streamer = threading.Thread(target=_stream_times, args=(c, "one", over, started, times))
    streamer.start()
    assert started.wait(120)
    t0 = time.monotonic()
    status, answer = Api(d).post(body, "/v1/completions", token=None, timeout=120)
    t1 = time.monotonic()
    over.set()
    streamer.join(120)
    assert status == 400 and answer["error"]["param"] == "prompt", answer
    during = [b - a for a, b in zip(times, times[1:], strict=False) if b > t0 and a < t1]
    read = t1 - t0
    assert read > 3, f"the read took {read:.1f}s: too short to tell anything (a longer body?)"
    assert len(during) > 10 and max(during) < read / 4, (read, max(during), len(during))

    # 2. A stop during a read: rung 1 at once, though the read outlasts the grace (1s).
    got: list[tuple[int, Any]] = []
    reader = threading.Thread(target=lambda: got.append(
        Api(d).post(body, "/v1/completions", token=None, timeout=120)))
    reader.start()
    d.until_instance("one", lambda i: "reading 1" in (i["ranks"][0]["status"] or ""),
                     what="the runner reading the request")
    d.ctl("stop", "one")
    reader.join(120)
    assert got and got[0][0] != 200, got
    steps = [e["extra"]["step"] for e in d.events(event="ladder", instance="one")]
    assert steps == ["ask"], f"must leave at rung 1, ladder: {steps}\n{d.log_text()[-3000:]}"
    (ex,) = d.events(event="exit", instance="one")
    assert ex["extra"]["pid"] == pid and ex["extra"]["code"] == 0
    assert ex["extra"]["signals_sent"] == ["ask"] and ex["extra"]["signal"] is None
    print(f"read {read:.1f}s; longest stream gap meanwhile {max(during) * 1000:.0f} ms")


def test_a_client_that_never_reads_is_no_hang(daemons: Any, tiny_model: Path) -> None:
    """A client asks for a stream and never reads it. Its answer piles up in the daemon until
    it is cut off ("read too slowly"), while its handler waits on a full socket. The hang watch
    counted progress where the client reads, and kept that stream as in flight: it took the
    instance for hung and restarted it, for every client."""
    d = daemons({"instances": {"chatty": {"model": str(tiny_model), "hang_after": "1s",
                                          "env": double_env("chatty")}}}, name="hostile")
    d.start()
    d.until_state("chatty", "ready")
    before = ranks(d, "chatty")
    api = Api(d)
    body = json.dumps({"model": "chatty", "messages": HELLO, "stream": True}).encode()
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)  # a small window, never read
        s.connect((api.host, api.port))
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
                  b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                  % (len(body), body))
        deadline = time.monotonic() + 60
        while "cancelled" not in d.log_text():  # the runner was told: cut off
            assert time.monotonic() < deadline, d.log_text()[-2000:]
            time.sleep(0.1)  # a log file has no event to wait on
        # Proving a negative: the watch would have fired within hang_after (1s) of the cut.
        time.sleep(3)
        assert ranks(d, "chatty") == before
        assert d.instance("chatty")["state"] == "ready"
