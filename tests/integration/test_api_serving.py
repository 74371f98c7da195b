"""Serving under pressure, with real runners: a burst of 50 requests against a limit and a
queue, a client that disconnects mid-stream, a runner that dies mid-request, a stop with
streams in flight, a port already taken, and a real model that must answer sensibly."""

from __future__ import annotations

import asyncio
import errno
import http.client
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import openai
import pytest

from exod.daemon.procinfo import rss_bytes
from tests.harness import EXOCTL, Daemon, free_port

EOS = "2"  # the tiny model's end token: logit_bias {EOS: -100} keeps it generating
HELLO = [{"role": "user", "content": "hello"}]
ENDLESS = {"max_tokens": 100_000,  # within the window (tests.models.tiny.CONTEXT)
           "logit_bias": {EOS: -100}}


def rss_kb(pid: int) -> int:
    rss = rss_bytes(pid)
    assert rss is not None, f"pid {pid} is gone"
    return rss // 1024


def client(d: Daemon, timeout: float = 60) -> openai.OpenAI:
    return openai.OpenAI(base_url=d.api_url() + "/v1", api_key="-", max_retries=0,
                         timeout=timeout)


class RawStream:
    """A streamed chat completion read event by event over plain HTTP."""

    def __init__(self, url: str, **body: Any) -> None:
        parts = urlsplit(url)
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
        self.conn.request("POST", "/v1/chat/completions",
                          json.dumps({"messages": HELLO, "stream": True, **body}),
                          {"Content-Type": "application/json"})
        self.resp = self.conn.getresponse()
        assert self.resp.status == 200, self.resp.read()

    def events(self) -> Iterator[bytes]:
        while True:
            line = self.resp.readline()
            if not line:
                return
            if line.startswith(b"data: "):
                assert self.resp.readline() == b"\n"  # each event ends with a blank line
                yield line[len(b"data: "):].rstrip(b"\n")

    def first_text(self) -> None:
        """Wait until the model has produced text (the generation is running)."""
        for e in self.events():
            chunk = json.loads(e)
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                return
        raise AssertionError("the stream ended before any text")

    def rest(self) -> list[bytes]:
        return list(self.events())

    def close(self) -> None:
        self.conn.close()


def api_state(d: Daemon, name: str) -> dict[str, Any]:
    parts = urlsplit(d.api_url())
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    conn.request("GET", f"/v1/models/{name}")
    return dict(json.loads(conn.getresponse().read()))


# ---- a burst against the limit and the queue ------------------------------------------------
def test_50_concurrent_requests_complete_or_get_429_and_rss_is_stable(
        daemons: Callable[..., Daemon], tiny_model: Path) -> None:
    d = daemons({"instances": {"tiny": {"model": str(tiny_model), "max_concurrency": 2,
                                        "max_queue": 8}}})
    d.start()
    d.until_state("tiny", "ready")
    url = d.api_url()

    async def burst() -> tuple[list[Any], list[Any]]:
        c = openai.AsyncOpenAI(base_url=url + "/v1", api_key="-", max_retries=0, timeout=120)

        async def one(i: int) -> Any:
            try:
                r = await c.chat.completions.create(
                    model="tiny", messages=[{"role": "user", "content": f"request {i}"}],
                    max_tokens=150, temperature=0, logit_bias={EOS: -100})
                return r
            except openai.RateLimitError as e:
                return e

        async with c:
            results = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(50))), 300)
        done = [r for r in results if not isinstance(r, openai.RateLimitError)]
        refused = [r for r in results if isinstance(r, openai.RateLimitError)]
        return done, refused

    rss = []
    for _ in range(3):
        done, refused = asyncio.run(burst())
        assert len(done) + len(refused) == 50  # nothing lost, nothing hung (wait_for above)
        assert len(done) >= 10 and refused  # 2 running + 8 queued at least; the rest 429
        for r in done:
            assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 150
        for e in refused:
            assert e.status_code == 429 and e.code == "queue_full"
        state = api_state(d, "tiny")
        assert (state["active"], state["queued"]) == (0, 0)
        rss.append(rss_kb(d.proc.pid))
    # The first burst warms up (buffers, imports); later ones must not grow the daemon.
    assert rss[2] - rss[1] < 3 * 1024, f"daemon RSS (kB) after each burst: {rss}"
    assert d.terminate() == 0


# ---- a client that leaves ------------------------------------------------------------------
@pytest.mark.timing  # the next request within 5 s
def test_disconnect_mid_stream_frees_the_runner_at_once(daemons: Callable[..., Daemon],
                                                        tiny_model: Path) -> None:
    d = daemons({"instances": {"tiny": {"model": str(tiny_model)}}})  # max_concurrency 1
    d.start()
    d.until_state("tiny", "ready")
    s = RawStream(d.api_url(), model="tiny", **ENDLESS)  # would run for many minutes
    s.first_text()
    d.until_instance("tiny", lambda i: i["ranks"][0]["status"] == "serving 1 request(s)")
    s.close()  # the client goes away: the runner drops the generation (STATUS=ready)
    d.until_instance("tiny", lambda i: i["ranks"][0]["status"] == "ready", timeout=30,
                     what="the runner to cancel the generation")
    t = time.monotonic()
    r = client(d, timeout=30).chat.completions.create(model="tiny", messages=HELLO,
                                                      max_tokens=5)
    took = time.monotonic() - t
    assert r.choices[0].message.content is not None
    assert took < 5, f"the next request waited {took:.1f}s: the runner was not freed"
    assert api_state(d, "tiny")["active"] == 0

    # The same for a request that is not streamed: the handler is cancelled, then the runner.
    parts = urlsplit(d.api_url())
    whole = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
    whole.request("POST", "/v1/chat/completions",
                  json.dumps({"model": "tiny", "messages": HELLO, **ENDLESS}),
                  {"Content-Type": "application/json"})
    d.until_instance("tiny", lambda i: i["ranks"][0]["status"] == "serving 1 request(s)")
    whole.close()
    d.until_instance("tiny", lambda i: i["ranks"][0]["status"] == "ready", timeout=30,
                     what="the runner to cancel the generation")
    assert d.terminate() == 0
    assert [e["extra"]["step"] for e in d.events(event="ladder")] == ["ask"]


# ---- a runner that dies ----------------------------------------------------------------------
def test_runner_dying_mid_request_ends_each_request_with_an_error(
        daemons: Callable[..., Daemon], tiny_model: Path) -> None:
    d = daemons({"instances": {"tiny": {"model": str(tiny_model), "max_concurrency": 2}}})
    d.start()
    pid = d.until_state("tiny", "ready")["ranks"][0]["pid"]
    parts = urlsplit(d.api_url())
    whole = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
    whole.request("POST", "/v1/chat/completions",  # sent first: it reaches the runner first
                  json.dumps({"model": "tiny", "messages": HELLO, **ENDLESS}),
                  {"Content-Type": "application/json"})
    s = RawStream(d.api_url(), model="tiny", **ENDLESS)
    s.first_text()  # the runner is generating for both
    os.kill(pid, signal.SIGKILL)
    *_, last, done = s.rest()
    assert done == b"[DONE]"
    err = json.loads(last)["error"]
    assert err["code"] == "runner_gone" and "exited" in err["message"]
    resp = whole.getresponse()
    assert resp.status == 503
    assert json.loads(resp.read())["error"]["code"] == "runner_gone"
    d.until_instance("tiny", lambda i: i["restarts"] == 1 and i["state"] == "ready",
                     what="tiny to restart (on-failure)")  # and serve again
    r = client(d).chat.completions.create(model="tiny", messages=HELLO, max_tokens=3)
    assert r.choices[0].message.content is not None


# ---- stop with streams in flight --------------------------------------------------------------
def test_stop_drains_then_aborts_streams_and_the_runner_leaves_at_rung_1(
        daemons: Callable[..., Daemon], tiny_model: Path) -> None:
    d = daemons({"instances": {"tiny": {
        "model": str(tiny_model), "max_concurrency": 3,
        "stop": {"grace": "60s", "drain": "3s"}}}})
    d.start()
    pid = d.until_state("tiny", "ready")["ranks"][0]["pid"]
    url = d.api_url()
    long_streams = [RawStream(url, model="tiny", **ENDLESS) for _ in range(2)]
    short = RawStream(url, model="tiny", max_tokens=60, logit_bias={EOS: -100})
    for s in (*long_streams, short):
        s.first_text()

    stopper = subprocess.Popen([*EXOCTL, "--socket", str(d.socket), "stop", "tiny"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    d.until_state("tiny", "stopping")
    with pytest.raises(openai.InternalServerError) as e:  # new work is refused at once
        client(d).chat.completions.create(model="tiny", messages=HELLO, max_tokens=2)
    assert e.value.status_code == 503 and e.value.code == "model_stopping"

    # The short one fits in the drain and finishes normally; the endless ones are aborted.
    *chunks, done = short.rest()
    assert done == b"[DONE]"
    assert json.loads(chunks[-1])["choices"][0]["finish_reason"] == "length"
    for s in long_streams:
        *_, last, done = s.rest()
        assert done == b"[DONE]"
        err = json.loads(last)["error"]
        assert err["code"] == "aborted" and "stopping" in err["message"]
    assert stopper.wait(120) == 0, stopper.stderr.read() if stopper.stderr else ""
    steps = [e["extra"]["step"] for e in d.events(event="ladder")]
    assert steps == ["ask"], f"the runner must leave at rung 1, ladder: {steps}"
    (ex,) = d.events(event="exit")
    assert ex["extra"]["pid"] == pid and ex["extra"]["code"] == 0
    assert d.terminate() == 0


# ---- start-up errors ----------------------------------------------------------------------
def test_port_in_use_is_a_one_line_fatal_error(daemons: Callable[..., Daemon],
                                               tiny_model: Path) -> None:
    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        d = daemons({"api": {"listen": f"127.0.0.1:{port}"},
                     "instances": {"tiny": {"model": str(tiny_model)}}})
        d.start(wait_ready=False)
        assert d.proc is not None and d.proc.wait(60) == 1
    msg = d.listener.wait_for(lambda f: "ERRNO" in f)
    assert msg["ERRNO"] == str(errno.EADDRINUSE)
    log = d.log_text()
    assert "Traceback" not in log
    (line,) = [x for x in log.splitlines() if "cannot start" in x]
    assert f"HTTP API 127.0.0.1:{port}: Address already in use" in line
    assert not d.events(event="state")  # no runner was ever started


# ---- a real model ---------------------------------------------------------------------------
def test_demo_model_answers_over_the_api_and_exoctl_chat(daemons: Callable[..., Daemon],
                                                         demo_model: Path) -> None:
    d = daemons({"instances": {"demo": {"model": str(demo_model)}}})
    d.start()
    d.until_state("demo", "ready")
    question = [{"role": "user", "content": "What is the capital of France?"}]
    r = client(d).chat.completions.create(model="demo", messages=question, max_tokens=20,
                                          temperature=0)
    assert "Paris" in (r.choices[0].message.content or "")
    res = subprocess.run([*EXOCTL, "--socket", str(d.socket), "chat", "demo",
                          "What is the capital of France?", "--temperature", "0",
                          "--max-tokens", "20"], check=False, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert "Paris" in res.stdout
