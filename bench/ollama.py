"""What Ollama's dialect costs (issue 30): `/api/chat` against `/v1/chat/completions` on the same
request (greedy, the demo model, one daemon), at 1 and 8 concurrent clients.

Two figures per level, each `/api/chat` over chat completions' (so 1.0 is parity):
- aggregate decode tokens/s (completion tokens / wall time from the first request sent to the
  last finished): goal >= 0.97x;
- time to first token, the baseline's over Ollama's (higher is better): goal >= 0.97x.

Both sides are read over raw HTTP with the same minimal parsing (a line, then JSON), so the
clients' own costs (pydantic models, httpx) do not blur what the server's adapter costs.
Noise (see bench.serving): the two sides take turns on the same instance, ABBA over `ROUNDS`
rounds (EXOD_BENCH_ROUNDS, default 8; at 1 client, twice as many, of four requests in a row a
side); each figure is the median of its per-round ratios, printed with their range. On a shared
machine the turns still meet different loads, so one more figure runs both sides at once: 8 clients,
4 on each endpoint in the same batches, each side's tokens/s per request (the same decode
steps serve both: what differs is the adapter). `EXOD_BENCH_MODEL=DIR` benchmarks another
model directory.
"""

from __future__ import annotations

import http.client
import json
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

from bench.agent import shown
from bench.api import demo_model
from bench.common import report
from bench.results import Figure
from tests.harness import Daemon

MAX_TOKENS = 64
LEVELS = (1, 8)
GOAL = 0.97
ROUNDS = int(os.environ.get("EXOD_BENCH_ROUNDS", "8"))
# Requests per client in one measurement. A lone 64-token answer takes about a second, and on a
# shared machine one such second is noise: a 1-client round's ratio ranged 0.69-1.24 at load 3.
REQUESTS = {1: 4}


def one(url: str, side: str, c: int) -> tuple[int, float]:
    """One streamed chat: (completion tokens, seconds to the first token)."""
    messages = [{"role": "user", "content": f"Tell me about {c + 1} cats."}]
    if side == "ollama":
        path, body = "/api/chat", {"model": "demo", "messages": messages, "stream": True,
                                   "options": {"num_predict": MAX_TOKENS, "temperature": 0}}
    else:
        path, body = "/v1/chat/completions", {
            "model": "demo", "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=600)
    t0 = time.perf_counter()
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    first, tokens = 0.0, 0
    for raw in resp:
        text = raw.strip()
        if side != "ollama":
            if not text.startswith(b"data: {"):
                continue
            text = text[len(b"data: "):]
        if not text:
            continue
        obj = json.loads(text)
        if side == "ollama":
            if not first and obj["message"].get("content"):
                first = time.perf_counter() - t0
            tokens = obj.get("eval_count", tokens)
        else:
            delta = (obj["choices"] or [{}])[0].get("delta") or {}
            if not first and delta.get("content"):
                first = time.perf_counter() - t0
            if obj.get("usage"):
                tokens = obj["usage"]["completion_tokens"]
    conn.close()
    return tokens, first


def measure(url: str, side: str, clients: int) -> tuple[float, float]:
    """(aggregate tokens/s, median time to first token) of `clients` concurrent clients, each
    sending REQUESTS[clients] chats one after the other."""
    per = REQUESTS.get(clients, 1)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(lambda c: one(url, side, c % clients), range(clients * per)))
    wall = time.perf_counter() - t0
    return sum(t for t, _ in results) / wall, statistics.median(f for _, f in results)


def mixed(url: str, clients: int) -> tuple[float, float]:
    """Both sides at once, half the clients each: (Ollama's tokens/s per request over the
    baseline's, the baseline's median time to first token over Ollama's)."""
    def timed(c: int) -> tuple[str, int, float, float]:
        side = "ollama" if c % 2 else "openai"
        t0 = time.perf_counter()
        tokens, first = one(url, side, c // 2)  # the same prompts on both sides
        return side, tokens, time.perf_counter() - t0, first

    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(timed, range(clients)))
    rate = {s: statistics.median(t / w for side, t, w, _ in results if side == s)
            for s in ("ollama", "openai")}
    first = {s: statistics.median(f for side, _, _, f in results if side == s)
             for s in ("ollama", "openai")}
    return rate["ollama"] / rate["openai"], first["openai"] / first["ollama"]


def main() -> None:
    path = Path(os.environ["EXOD_BENCH_MODEL"]) if os.environ.get("EXOD_BENCH_MODEL") \
        else demo_model()
    d = Daemon({"instances": {"demo": {"model": str(path), "max_concurrency": 8}}},
               name="bench-ollama")
    try:
        d.start()
        d.until_state("demo", "ready")
        url = d.api_url()
        rows: list[Figure] = []
        for clients in LEVELS:
            measure(url, "openai", clients)  # warm: the first requests compile kernels
            ratios, firsts = [], []
            for r in range(ROUNDS * 2 if clients == 1 else ROUNDS):  # ABBA
                order = ("ollama", "openai") if r % 2 == 0 else ("openai", "ollama")
                got = {side: measure(url, side, clients) for side in order}
                ratios.append(got["ollama"][0] / got["openai"][0])
                firsts.append(got["openai"][1] / got["ollama"][1])
            rows.append(shown(f"/api/chat / chat completions, {clients} client(s), tok/s",
                              ratios, GOAL))
            rows.append(shown(f"/api/chat / chat completions, {clients} client(s), first token "
                              "(baseline's time / Ollama's)", firsts, GOAL))
        together = [mixed(url, 8) for _ in range(ROUNDS)]
        rows.append(shown("/api/chat / chat completions, 4 + 4 clients at once, tok/s a "
                          "request", [a for a, _ in together], GOAL))
        rows.append(shown("/api/chat / chat completions, 4 + 4 clients at once, first token",
                          [b for _, b in together], GOAL))
        report("ollama: /api/chat against /v1/chat/completions", rows)
    finally:
        d.close()


if __name__ == "__main__":
    main()
