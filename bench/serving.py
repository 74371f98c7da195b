"""Serving under load: exod against `mlx_lm.server`, started in the same run on the same model.

Figures (each printed as exod / mlx_lm.server): aggregate decode tokens/s with 1, 8 and 32
concurrent clients; median and p95 time to first token (TTFT) with 8; the TTFT of the second
turn of a ~1k-token chat (what a prompt cache buys); the peak RSS of the process that holds the
model (exod's runner; the whole mlx_lm.server). Plus exod's own 8-client aggregate against its
1-client figure: what batching buys on this machine.

Fair play: the demo model in float32 on both sides, OpenBLAS on both (exod's runner preloads
it, mlx_lm.server gets LD_PRELOAD), the official openai client, streaming with usage, greedy
sampling, the same prompts and the same max_tokens. exod runs with max_concurrency 32 (the
batch width of mlx_lm.server's default --decode-concurrency) and its default prompt cache;
mlx_lm.server with its defaults. The sides take turns, so a busy moment of the machine does not
fall on one side only: every figure is measured twice per side, in the order exod,
mlx_lm.server, mlx_lm.server, exod (the mean of both, or the median for TTFTs). Aggregate =
completion tokens (from `usage`) of every request / the wall time from the first request sent
to the last one finished.

`EXOD_BENCH_MODEL=DIR` benchmarks another model directory (default: the demo model).
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai

from bench.api import demo_model, pct, start_mlx_lm_server
from bench.common import report, verdict
from exod.daemon.procinfo import rss_bytes
from tests.harness import Daemon

MAX_TOKENS = 32
LEVELS = (1, 8, 32)
WAVES = {1: 2, 8: 1, 32: 1}  # requests per client at each level
CHAT_TURNS = 1  # rounds of second-turn measurements (two per side per round, each its own chat)


def question(i: int) -> str:
    return f"Question {i}: write two sentences about the number {i}."


def long_text(i: int) -> str:
    """~1k tokens of text that no other chat shares (but for the chat template's head)."""
    words = " ".join(f"item-{i}-{k} is on shelf {k % 17} next to box {k * 7 % 31}."
                     for k in range(55))
    return f"Chat {i}. Read this inventory and remember it.\n{words}"


@dataclass
class Result:
    ttft: float
    tokens: int


@dataclass
class Side:
    name: str
    client: openai.OpenAI
    model: str
    pid: int

    def chat(self, messages: list[Any], max_tokens: int = MAX_TOKENS) -> tuple[Result, str]:
        t0 = time.perf_counter()
        stream = self.client.chat.completions.create(
            model=self.model, messages=messages, max_tokens=max_tokens, temperature=0,
            stream=True, stream_options={"include_usage": True})
        first: float | None = None
        text, tokens = "", 0
        for chunk in stream:
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
            for choice in chunk.choices:
                if choice.delta.content:
                    first = first or time.perf_counter()
                    text += choice.delta.content
        assert first is not None, f"{self.name}: no text"
        return Result(first - t0, tokens), text


def load(side: Side, clients: int, waves: int) -> tuple[float, list[float]]:
    """(aggregate tokens/s, TTFTs) of `clients` concurrent clients, `waves` requests each."""
    def client(c: int) -> list[Result]:
        return [side.chat([{"role": "user", "content": question(c * 100 + w)}])[0]
                for w in range(waves)]

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = [r for rs in pool.map(client, range(clients)) for r in rs]
    wall = time.perf_counter() - t0
    return sum(r.tokens for r in results) / wall, [r.ttft for r in results]


def second_turn(side: Side, i: int) -> float:
    turn1 = [{"role": "user", "content": long_text(i)}]
    _, answer = side.chat(turn1, max_tokens=16)
    turn2 = [*turn1, {"role": "assistant", "content": answer},
             {"role": "user", "content": "Which shelf is item 3 on? One word."}]
    return side.chat(turn2, max_tokens=8)[0].ttft


class PeakRss:
    """Samples the RSS of some pids every 100 ms; keeps the peak of each."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.peak = dict.fromkeys(pids, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            for name, pid in self.pids.items():
                self.peak[name] = max(self.peak[name], rss_bytes(pid) or 0)

    def stop(self) -> dict[str, int]:
        self._stop.set()
        self._thread.join()
        return self.peak


def start_sides(path: Path) -> tuple[Side, Side, Callable[[], None]]:
    d = Daemon({"ready": "instances", "instances": {"demo": {
        "model": str(path), "max_concurrency": 32, "max_queue": 64}}}, name="bench-serving")
    d.start()
    runner = int(d.instance("demo")["ranks"][0]["pid"])
    server, srv = start_mlx_lm_server(path)

    def client(url: str) -> openai.OpenAI:
        # Retries: a pooled keep-alive connection the server has just closed is reset on reuse
        # (seen with 32 clients); the retry happens before any response, so times stay true.
        return openai.OpenAI(base_url=url + "/v1", api_key="-", max_retries=2, timeout=600)

    exod = Side("exod", client(d.api_url()), "demo", runner)
    mlx = Side("mlx_lm.server", client(f"http://127.0.0.1:{srv.port}"), srv.model, server.pid)

    def close() -> None:
        d.terminate()
        d.close()
        server.terminate()
        server.wait(60)

    return exod, mlx, close


def measure(sides: list[Side]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {s.name: {"ttft8": [], "turn2": []} for s in sides}
    for s in sides:
        s.chat([{"role": "user", "content": "warm up"}], max_tokens=4)
    abba = [*sides, *reversed(sides)]  # each side once early, once late: drift cancels
    for level in LEVELS:
        rates: dict[str, list[float]] = {s.name: [] for s in sides}
        for s in abba:
            rate, ttfts = load(s, level, WAVES[level])
            rates[s.name].append(rate)
            if level == 8:
                out[s.name]["ttft8"] += ttfts
        for name, r in rates.items():
            out[name][f"rate{level}"] = statistics.mean(r)
    for i in range(CHAT_TURNS):
        for s in abba[i % 2 * 2:] + abba[: i % 2 * 2]:
            out[s.name]["turn2"].append(second_turn(s, i * 10 + len(out[s.name]["turn2"])))
    return out


def main() -> None:
    path = Path(os.environ["EXOD_BENCH_MODEL"]) if os.environ.get("EXOD_BENCH_MODEL") \
        else demo_model()
    exod, mlx, close = start_sides(path)
    try:
        rss = PeakRss({exod.name: exod.pid, mlx.name: mlx.pid})
        t0 = time.monotonic()
        res = measure([exod, mlx])
        peak = rss.stop()
        took = time.monotonic() - t0
    finally:
        close()
    e, m = res["exod"], res["mlx_lm.server"]
    rows: list[tuple[str, str]] = []
    for level in LEVELS:
        r = e[f"rate{level}"] / m[f"rate{level}"]
        rows.append((f"aggregate tok/s, {level} client(s)",
                     f"exod {e[f'rate{level}']:6.1f}  mlx_lm.server {m[f'rate{level}']:6.1f}  "
                     f"ratio {r:.2f}x  (goal ≥ 1.0x) {verdict(r >= 1.0)}"))
    for label, q in (("median", 0.5), ("p95", 0.95)):
        a, b = pct(e["ttft8"], q), pct(m["ttft8"], q)
        rows.append((f"TTFT {label}, 8 clients",
                     f"exod {a * 1e3:7.0f} ms  mlx_lm.server {b * 1e3:7.0f} ms  "
                     f"ratio {a / b:.2f}x  (goal ≤ 1.0x) {verdict(a <= b)}"))
    a, b = statistics.median(e["turn2"]), statistics.median(m["turn2"])
    rows.append(("second-turn TTFT, ~1k-token chat",
                 f"exod {a * 1e3:7.0f} ms  mlx_lm.server {b * 1e3:7.0f} ms  "
                 f"ratio {a / b:.2f}x  (goal ≤ 1.0x) {verdict(a <= b)}"))
    a, b = peak["exod"], peak["mlx_lm.server"]
    rows.append(("peak RSS (exod's runner / mlx_lm.server)",
                 f"exod {a / 2**20:6.0f} MiB  mlx_lm.server {b / 2**20:6.0f} MiB  "
                 f"ratio {a / b:.2f}x  (goal ≤ 1.0x) {verdict(a <= b)}"))
    own = e["rate8"] / e["rate1"]
    rows.append(("exod 8 clients / exod 1 client (aggregate)", f"{own:.2f}x"))
    report(f"serving under load, {path.name}: max_tokens {MAX_TOKENS}, greedy, OpenBLAS on "
           f"both, openai client, {took:.0f} s", rows)


if __name__ == "__main__":
    main()
