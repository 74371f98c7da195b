"""The OpenAI-compatible HTTP API end to end, driven by the official `openai` client (and by
raw HTTP where the wire format itself is under test), against a real daemon and real runners
of the tiny model. One daemon serves the whole module: these tests only read.

Reference for the objects: the OpenAI API reference (chat completion, chat completion chunk,
completion, error) and its `stream_options.include_usage` text.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import openai
import pytest
import tokenizers

from tests.models.tiny import corrupt_model
from tests.harness import EXOCTL, Daemon

TOKEN = "s3cret-token"
EOS = "2"  # the tiny model's <|im_end|>: logit_bias {EOS: -100} keeps it generating
HELLO = [{"role": "user", "content": "hello"}]


class Served:
    def __init__(self, daemon: Daemon, model: Path) -> None:
        self.d = daemon
        self.model = model
        self.url = daemon.api_url()
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key=TOKEN, max_retries=0,
                                    timeout=60)

    def raw(self, method: str, path: str, body: Any = None, token: str | None = TOKEN,
            accept: str | None = None) -> tuple[http.client.HTTPResponse, bytes]:
        parts = urlsplit(self.url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
        headers = {"Content-Type": "application/json", **({"Accept": accept} if accept else {})}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        conn.request(method, path, data, headers)
        resp = conn.getresponse()
        return resp, resp.read()

    def greedy(self, n: int, **kw: Any) -> str:
        r = self.client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=n,
                                                temperature=0, **kw)
        return r.choices[0].message.content or ""


@pytest.fixture(scope="module")
def served(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("api")
    token_file = tmp / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)  # a secret: closed to other users
    broken = corrupt_model(tiny_model, tmp / "broken")
    d = Daemon({
        "api": {"listen": "127.0.0.1:0", "token_file": str(token_file)},
        "instances": {
            "tiny": {"model": str(tiny_model)},
            "idle": {"model": str(tiny_model), "autostart": False},
            "broken": {"model": str(broken), "restart": "no"},
        }})
    try:
        d.start()
        d.watch_until(lambda s: {i["name"]: i["state"] for i in s["instances"]}
                      == {"tiny": "ready", "idle": "stopped", "broken": "failed"},
                      what="tiny ready, idle stopped, broken failed")
        yield Served(d, tiny_model)
    finally:
        d.close()


def sse_events(raw: bytes) -> list[bytes]:
    """Split an SSE body into events, checking the framing: `data: ` lines, blank line after."""
    assert raw.endswith(b"\n\n"), raw[-50:]
    events = raw[:-2].split(b"\n\n")
    for e in events:
        assert e.startswith(b"data: ") and b"\n" not in e, e
    return [e[len(b"data: "):] for e in events]


# ---- plain endpoints, auth ----------------------------------------------------------------
def test_health_needs_no_token_everything_else_does(served: Served) -> None:
    resp, body = served.raw("GET", "/health", token=None)
    assert resp.status == 200 and json.loads(body)["status"] == "ok"
    for path in ("/v1/models", "/ready"):
        resp, body = served.raw("GET", path, token=None)
        assert resp.status == 401, path
        assert resp.getheader("WWW-Authenticate") == "Bearer"
        err = json.loads(body)["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert err["code"] == "invalid_api_key"
    bad = openai.OpenAI(base_url=served.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.models.list()
    assert e.value.status_code == 401 and e.value.code == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="tiny", messages=HELLO)


def test_a_big_body_is_read_off_the_loop(served: Served) -> None:
    """A body near api.max_body_kib of small input items: its dialect read it in 1.7 s when
    this test was written (0.35 s alone now), several times as long as its JSON takes to
    parse. It was read on the loop (only the JSON was parsed off it), and /health waited all
    that time; now /health answers meanwhile (after the JSON at most: the C parser holds the
    GIL). The last item is broken, so that reading the body is all the request costs."""
    n = 110_000  # 3.9 MB, under the default 4 MiB
    body = (b'{"model": "tiny", "input": [' + b'{"role": "user", "content": "q"}, ' * n
            + b'{"role": "nobody", "content": "q"}]}')
    outcome: dict[str, Any] = {}
    done = threading.Event()

    def big() -> None:
        start = time.monotonic()
        resp, answer = served.raw("POST", "/v1/responses", body)
        outcome.update(status=resp.status, answer=answer, took=time.monotonic() - start)
        done.set()

    thread = threading.Thread(target=big)
    thread.start()
    waits = []
    while not done.is_set():
        start = time.monotonic()
        assert served.raw("GET", "/health", token=None)[0].status == 200
        waits.append(time.monotonic() - start)
    thread.join()
    assert outcome["status"] == 400 and f"input[{n}].role".encode() in outcome["answer"]
    # Read on the loop, one /health would wait for nearly all of the read and few would be
    # answered meanwhile. Half the read, not a third: under the suite's load one /health once
    # waited 0.32 s of a read that took 0.92 s (the daemon's process waiting for a core).
    assert len(waits) >= 5 and max(waits) < outcome["took"] / 2, (waits, outcome["took"])


def test_ready_lists_autostart_instances_that_are_not_ready(served: Served) -> None:
    resp, body = served.raw("GET", "/ready")
    assert resp.status == 503
    doc = json.loads(body)
    assert doc["not_ready"] == [{"name": "broken", "state": "failed"}]  # idle: no autostart
    assert doc["error"]["code"] == "not_ready" and "broken" in doc["error"]["message"]


def test_models_lists_every_instance_with_its_state(served: Served) -> None:
    models = served.client.models.list()
    assert [(m.id, m.object, m.owned_by) for m in models.data] == [
        ("broken", "model", "exod"), ("idle", "model", "exod"), ("tiny", "model", "exod")]
    states = {m.id: m.model_extra["state"] for m in models.data}
    assert states == {"broken": "failed", "idle": "stopped", "tiny": "ready"}
    assert all(isinstance(m.created, int) for m in models.data)
    assert served.client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError):
        served.client.models.retrieve("nope")


# ---- chat -----------------------------------------------------------------------------------
def test_chat_non_streaming(served: Served) -> None:
    r = served.client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=12,
                                              temperature=0)
    assert r.object == "chat.completion" and r.model == "tiny" and r.id.startswith("chatcmpl-")
    assert isinstance(r.created, int) and isinstance(r.system_fingerprint, str)
    (choice,) = r.choices
    assert choice.index == 0 and choice.message.role == "assistant"
    assert choice.message.content and choice.finish_reason in ("length", "stop")
    assert r.usage is not None and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    if choice.finish_reason == "length":
        assert r.usage.completion_tokens == 12
    assert served.greedy(12) == choice.message.content  # greedy is deterministic


def test_chat_streaming_sse_framing_and_chunks_field_by_field(served: Served) -> None:
    body = {"model": "tiny", "messages": HELLO, "max_tokens": 10, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True},
            "logit_bias": {EOS: -100}}
    resp, raw = served.raw("POST", "/v1/chat/completions", body)
    assert resp.status == 200
    assert resp.getheader("Content-Type", "").startswith("text/event-stream")
    assert resp.getheader("Cache-Control") == "no-cache"
    *events, done = sse_events(raw)
    assert done == b"[DONE]"
    chunks = [json.loads(e) for e in events]
    first, *middle, last, usage = chunks
    ids = {c["id"] for c in chunks}
    assert len(ids) == 1 and ids.pop().startswith("chatcmpl-")
    assert len({c["created"] for c in chunks}) == 1
    for c in chunks:
        assert c["object"] == "chat.completion.chunk" and c["model"] == "tiny"
        assert isinstance(c["created"], int) and isinstance(c["system_fingerprint"], str)
    for c in (first, *middle, last):  # include_usage: usage on every chunk, null but the last
        assert set(c) == {"id", "object", "created", "model", "system_fingerprint", "choices",
                          "usage"}
        assert c["usage"] is None
        (choice,) = c["choices"]
        assert set(choice) == {"index", "delta", "logprobs", "finish_reason"}
        assert choice["index"] == 0 and choice["logprobs"] is None
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert first["choices"][0]["finish_reason"] is None
    for c in middle:
        assert set(c["choices"][0]["delta"]) == {"content"}
        assert c["choices"][0]["finish_reason"] is None
    assert last["choices"][0]["delta"] == {} and last["choices"][0]["finish_reason"] == "length"
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == 10
    assert usage["usage"]["total_tokens"] == (usage["usage"]["prompt_tokens"]
                                              + usage["usage"]["completion_tokens"])
    text = "".join(c["choices"][0]["delta"]["content"] for c in middle)
    assert text == served.greedy(10, logit_bias={EOS: -100})  # same text as non-streaming

    # The official client reads the same stream.
    stream = served.client.chat.completions.create(
        model="tiny", messages=HELLO, max_tokens=10, temperature=0, stream=True,
        stream_options={"include_usage": True}, logit_bias={EOS: -100})
    got = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in got if c.choices) == text
    assert got[-1].usage is not None and got[-1].usage.completion_tokens == 10
    plain = list(served.client.chat.completions.create(
        model="tiny", messages=HELLO, max_tokens=3, stream=True))
    assert all(c.usage is None for c in plain) and all(c.choices for c in plain)


def test_seed_makes_sampling_repeatable(served: Served) -> None:
    def sample(seed: int) -> str:
        r = served.client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=16,
                                                  temperature=1.0, top_p=0.9, seed=seed,
                                                  logit_bias={EOS: -100})
        return r.choices[0].message.content or ""

    assert sample(7) == sample(7)
    assert len({sample(s) for s in (1, 2, 3)}) > 1


# ---- completions ----------------------------------------------------------------------------
def test_completions_and_prompt_token_count(served: Served) -> None:
    prompt = "def main():\n    return"
    r = served.client.completions.create(model="tiny", prompt=prompt, max_tokens=8,
                                         temperature=0, logit_bias={EOS: -100})
    assert r.object == "text_completion" and r.id.startswith("cmpl-") and r.model == "tiny"
    (choice,) = r.choices
    assert choice.index == 0 and choice.finish_reason == "length" and choice.text
    tok = tokenizers.Tokenizer.from_file(str(served.model / "tokenizer.json"))
    assert r.usage is not None
    assert r.usage.prompt_tokens == len(tok.encode(prompt).ids)
    assert r.usage.completion_tokens == 8
    stream = served.client.completions.create(model="tiny", prompt=prompt, max_tokens=8,
                                              temperature=0, stream=True,
                                              stream_options={"include_usage": True},
                                              logit_bias={EOS: -100})
    chunks = list(stream)
    assert all(c.object == "text_completion" and c.id == chunks[0].id for c in chunks)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (r.usage.prompt_tokens, 8)
    # The same prompt again: all of it but its last token comes from the prompt cache.
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == r.usage.prompt_tokens - 1


# ---- stop sequences -------------------------------------------------------------------------
def test_stop_sequences_cut_the_text_and_finish_with_stop(served: Served) -> None:
    full = served.greedy(40, logit_bias={EOS: -100})
    # A stop sequence from the middle of the known greedy answer (not found before it).
    stop = next(full[i:i + 3] for i in range(5, len(full) - 3)
                if full[i:i + 3].strip() and full.find(full[i:i + 3]) == i)
    cut = full[:full.find(stop)]
    r = served.client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=40,
                                              temperature=0, stop=[stop, "\x00never"],
                                              logit_bias={EOS: -100})
    assert r.choices[0].message.content == cut
    assert r.choices[0].finish_reason == "stop"
    assert r.usage is not None and r.usage.completion_tokens < 40
    stream = served.client.chat.completions.create(
        model="tiny", messages=HELLO, max_tokens=40, temperature=0, stop=stop, stream=True,
        logit_bias={EOS: -100})
    chunks = [c for c in stream if c.choices]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == cut
    assert chunks[-1].choices[0].finish_reason == "stop"


# ---- errors ---------------------------------------------------------------------------------
def test_errors_have_openai_shape_and_status(served: Served) -> None:
    c = served.client
    with pytest.raises(openai.NotFoundError) as nf:
        c.chat.completions.create(model="nope", messages=HELLO)
    assert nf.value.status_code == 404 and nf.value.code == "model_not_found"
    assert nf.value.param == "model"

    for name in ("idle", "broken"):  # stopped, failed
        with pytest.raises(openai.InternalServerError) as nr:
            c.chat.completions.create(model=name, messages=HELLO)
        assert nr.value.status_code == 503 and nr.value.code == "model_not_ready"
        assert nr.value.response.headers["Retry-After"].isdigit()

    with pytest.raises(openai.BadRequestError) as br:
        c.chat.completions.create(model="tiny", messages=[])
    assert br.value.status_code == 400 and br.value.param == "messages"
    with pytest.raises(openai.BadRequestError) as br:
        c.chat.completions.create(model="tiny", messages=HELLO, temperature=5)
    assert br.value.param == "temperature"
    with pytest.raises(openai.BadRequestError):
        c.completions.create(model="tiny", prompt=[1, 2, 3])
    with pytest.raises(openai.BadRequestError) as br:  # refused by the runner, which goes on
        c.completions.create(model="tiny", prompt="")
    assert "empty" in br.value.message
    assert c.completions.create(model="tiny", prompt="x", max_tokens=2).choices[0].text

    resp, body = served.raw("POST", "/v1/chat/completions", b"{not json")
    assert resp.status == 400
    assert json.loads(body)["error"]["type"] == "invalid_request_error"
    resp, body = served.raw("GET", "/v1/nothing-here")
    assert resp.status == 404 and set(json.loads(body)["error"]) == {"message", "type", "param",
                                                                      "code"}
    resp, body = served.raw("GET", "/v1/chat/completions")
    assert resp.status == 405 and "error" in json.loads(body)


# ---- exoctl chat ----------------------------------------------------------------------------
def exoctl(served: Served, *args: str, stdin: str | None = None
           ) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "EXOD_API_TOKEN"}
    return subprocess.run([*EXOCTL, "--socket", str(served.d.socket), *args], input=stdin,
                          check=False, capture_output=True, text=True, timeout=120, env=env)


def test_exoctl_chat_prompt_streams_the_answer(served: Served) -> None:
    res = exoctl(served, "chat", "tiny", "hello", "--temperature", "0", "--max-tokens", "12")
    assert res.returncode == 0, res.stderr
    assert res.stdout == served.greedy(12) + "\n"  # the token file came from the status


def test_exoctl_chat_interactive_keeps_history_and_json_prints_chunks(served: Served) -> None:
    res = exoctl(served, "chat", "tiny", "--json", "--max-tokens", "4", stdin="hello\nagain\n")
    assert res.returncode == 0, res.stderr
    chunks = [json.loads(line) for line in res.stdout.splitlines()]
    usage = [c["usage"] for c in chunks if c.get("usage")]
    assert len(usage) == 2  # two turns
    assert usage[1]["prompt_tokens"] > usage[0]["prompt_tokens"] + 4  # history was sent
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)


def test_exoctl_chat_errors_are_one_line(served: Served) -> None:
    res = exoctl(served, "chat", "idle", "hello")
    assert res.returncode == 1
    assert "not ready" in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def scrape(served: Served) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics, keyed by (name, sorted labels)."""
    from prometheus_client.parser import text_string_to_metric_families

    resp, body = served.raw("GET", "/metrics")
    assert resp.status == 200
    assert resp.getheader("Content-Type", "").startswith("text/plain; version=")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(body.decode()) for s in fam.samples}


def test_metrics_behind_the_token_and_live(served: Served) -> None:
    resp, _ = served.raw("GET", "/metrics", token=None)
    assert resp.status == 401
    before = scrape(served)
    tiny = (("instance", "tiny"),)
    ok = (("code", "200"), ("instance", "tiny"))
    r = served.client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=5,
                                              temperature=0, logit_bias={EOS: -100})
    assert r.usage is not None and r.usage.completion_tokens == 5
    with pytest.raises(openai.NotFoundError):
        served.client.chat.completions.create(model="no-such-model", messages=HELLO)
    after = scrape(served)

    def delta(name: str, labels: tuple[tuple[str, str], ...]) -> float:
        return after.get((name, labels), 0.0) - before.get((name, labels), 0.0)

    assert delta("exod_requests_total", ok) == 1
    assert delta("exod_generated_tokens_total", tiny) == 5
    assert delta("exod_prompt_tokens_total", tiny) == r.usage.prompt_tokens
    assert delta("exod_time_to_first_token_seconds_count", tiny) == 1
    assert delta("exod_time_per_output_token_seconds_count", tiny) == 1
    assert not any(dict(k[1]).get("instance") == "no-such-model" for k in after), \
        "an unknown model name must not become a label"
    # Live state, read at scrape time.
    assert after[("exod_instance_state", (("instance", "tiny"), ("state", "ready")))] == 1
    assert after[("exod_instance_state", (("instance", "broken"), ("state", "failed")))] == 1
    assert after[("exod_instance_state", (("instance", "idle"), ("state", "ready")))] == 0
    assert after[("exod_queue_depth", tiny)] == 0
    assert after[("exod_requests_in_flight", tiny)] == 0
    assert after[("exod_load_layers_loaded", tiny)] == after[("exod_load_layers_total", tiny)] > 0
    assert after[("exod_instance_restarts_total", (("instance", "broken"),))] == 0
    assert delta("exod_prompt_cache_lookups_total", tiny) == 1  # rank 0's engine reports it
    assert after[("exod_uptime_seconds", ())] > 0
    assert ("exod_reloads_total", (("result", "ok"),)) in after
    assert ("exod_config_errors_total", ()) in after


def test_a_prompt_longer_than_one_prefill_chunk(served: Served) -> None:
    """mlx-lm takes a prompt in chunks of 2048 tokens; the runner reports each chunk (progress
    for hang detection) and the answer is unchanged by those reports, whole or streamed."""
    prompt = "hello " * 3000
    r = served.client.completions.create(model="tiny", prompt=prompt, max_tokens=3,
                                         temperature=0)
    assert r.usage is not None and r.usage.prompt_tokens > 2048
    streamed = "".join(c.choices[0].text for c in served.client.completions.create(
        model="tiny", prompt=prompt, max_tokens=3, temperature=0, stream=True) if c.choices)
    assert streamed == r.choices[0].text


def test_status_page_is_public_and_its_data_is_not(served: Served) -> None:
    # A browser asks for HTML (others get Ollama's words: test_ollama).
    resp, body = served.raw("GET", "/", token=None, accept="text/html,application/xhtml+xml")
    assert resp.status == 200 and resp.getheader("Content-Type", "").startswith("text/html")
    assert b"status.json" in body and b"tiny" not in body  # the page holds no data itself
    resp, _ = served.raw("GET", "/status.json", token=None)
    assert resp.status == 401
    resp, body = served.raw("GET", "/status.json")
    data = json.loads(body)
    assert resp.status == 200 and {i["name"] for i in data["instances"]} == {
        "tiny", "idle", "broken"}
    assert data["serving"]["tiny"]["queued"] == 0 and "logs" in data
