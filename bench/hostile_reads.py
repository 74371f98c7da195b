"""A hostile read: one client sends a prompt of megabytes (refused after tokenizing, as past the
context window) while another client streams an answer, on 1 rank and on a 2-rank pipeline of
a generated model. The runner reads (templates and tokenizes) a request on a thread of its own
(exod.runner.serving.reading) while its batch goes on, so the stream should not stall while it
reads.

Printed: the stream's longest gap between two chunks during the read, over its median gap
alone (a ratio: how long the batch stands still; goal: a few, where reading between two steps
of the batch gave ~470x), the read's own time, and whether any rank restarted (goal: none; the
read is reported as progress).
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from urllib.parse import urlsplit

import openai

from bench.common import median, model, report
from bench.results import Figure
from tests.harness import Daemon

WORDS = 600_000  # "hello " * WORDS: 3.6 MB, about 1.8M tokens of the generated tokenizer
EOS = "2"


def gaps(c: openai.OpenAI, name: str, over: threading.Event | None = None,
         started: threading.Event | None = None) -> list[float]:
    """The gaps between the chunks of one streamed answer: 200 chunks, or with `over`, until
    it is set (the client then leaves)."""
    out: list[float] = []
    last = None
    with c.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}],
                                   max_tokens=4000, temperature=0, stream=True,
                                   logit_bias={EOS: -100}) as stream:
        for _ in stream:
            now = time.perf_counter()
            if last is not None:
                out.append(now - last)
            last = now
            if started is not None and len(out) == 20:
                started.set()  # under way: the read starts now
            if over.is_set() if over is not None else len(out) >= 200:
                break  # the client leaves (the stream is closed)
    return out


def read(url: str, name: str) -> tuple[int, float]:
    parts = urlsplit(url)
    body = json.dumps({"model": name, "prompt": "hello " * WORDS, "max_tokens": 1}).encode()
    conn = http.client.HTTPConnection(str(parts.hostname), int(parts.port or 80), timeout=300)
    t = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    status = conn.getresponse().status
    return status, time.perf_counter() - t


def one(d: Daemon, name: str) -> list[Figure]:
    c = openai.OpenAI(base_url=d.api_url() + "/v1", api_key="-", max_retries=0, timeout=300)
    before = [r["pid"] for r in d.instance(name)["ranks"]]
    alone = median(gaps(c, name))
    started, over = threading.Event(), threading.Event()
    got: list[tuple[int, float]] = []

    def attacker() -> None:
        started.wait(120)
        got.append(read(d.api_url(), name))
        over.set()

    t = threading.Thread(target=attacker)
    t.start()
    worst = max(gaps(c, name, over, started))
    t.join()
    status, took = got[0]
    after = d.instance(name)
    same = after["restarts"] == 0 and [r["pid"] for r in after["ranks"]] == before
    return [Figure(f"{name}: longest gap during the read / median gap", worst / alone,
                   goal="< a tenth of the read", met=worst < took / 10),
            Figure(f"{name}: the read", took, unit="s", text=f"answered {status}"),
            Figure(f"{name}: rank restarts", 0 if same else 1, unit="", goal="== 0",
                   met=same and status == 400)]


def main() -> None:
    path = model("tiny-6", layers=6)
    short = {"hang_after": "2s", "peer_timeout": "2s", "max_concurrency": 4}
    d = Daemon({"api": {"listen": "127.0.0.1:0", "max_body_kib": 8192},
                "instances": {"one": {"model": str(path), **short},
                              "pp": {"model": str(path), "shards": 2, **short}}},
               name="bench-reads")
    try:
        d.start()
        rows: list[Figure] = []
        for name in ("one", "pp"):
            d.until_state(name, "ready")
            rows += one(d, name)
        report("hostile reads: a 3.6 MB prompt beside a stream (hang_after and peer_timeout 2s)",
               rows)
    finally:
        d.close()


if __name__ == "__main__":
    main()
