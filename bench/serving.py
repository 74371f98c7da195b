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
mlx_lm.server with its defaults.

Noise: this bench usually runs on a small machine that other work shares, where the same figure
can move a lot from one minute to the next. So it runs `ROUNDS` rounds (EXOD_BENCH_ROUNDS), and in
every round each figure on both sides back to back, exod first in even rounds and mlx_lm.server
first in odd ones (two rounds make an ABBA). Each figure is the median of its per-round ratios
exod / mlx_lm.server (two measurements taken next to each other in time), printed with the
range of those ratios, so a reader sees how far to trust it. With one client the two sides take
turns request by request instead (`one_client`). The p95 TTFT pools every request
of every round per side. The second turn runs twice per side and round, ABBA within the round
(its per-round figure is the mean of the two). Aggregate = completion tokens (from `usage`) of
every request / the wall time from the first request sent to the last one finished. The load
average before and after the run is printed too.

`EXOD_BENCH_MODEL=DIR` benchmarks another model directory (default: the demo model).
"""

from __future__ import annotations

import collections
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai

from bench.api import demo_model, pct, start_mlx_lm_server
from bench.common import report
from bench.results import Figure
from exod.daemon.procinfo import rss_bytes
from tests.harness import Daemon

MAX_TOKENS = 32
LEVELS = (1, 8, 32)
# Requests per client at each level. One client's requests alternate between the two sides,
# request by request (see one_client): 6 pairs a round.
WAVES = {1: 6, 8: 1, 32: 1}
ROUNDS = 4  # every figure once per side per round (EXOD_BENCH_ROUNDS); two rounds = ABBA


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


def one_client(sides: list[Side], waves: int, r: int) -> dict[str, float]:
    """Aggregate tokens/s of one client per side, the sides taking turns request by request
    (in the order of `order`, turned every request). A whole run of requests on one side,
    then on the other, left ~20 s between the two halves of a pair: on this shared machine
    the per-round ratio then ranged 0.83-1.29 for two equal servers; a pair of requests a few
    seconds apart cancels most of what the machine's load does to both."""
    tokens = dict.fromkeys((s.name for s in sides), 0)
    wall = dict.fromkeys(tokens, 0.0)
    for w in range(waves):
        for s in order(r + w, sides):
            t0 = time.perf_counter()
            res, _ = s.chat([{"role": "user", "content": question(r * 100 + w)}])
            wall[s.name] += time.perf_counter() - t0
            tokens[s.name] += res.tokens
    return {name: tokens[name] / wall[name] for name in tokens}


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
    # context_tokens: what the memory check reserves per generation; every conversation here
    # stays under 1.2k tokens, and the default (4k x 32) does not fit a busy shared machine.
    d = Daemon({"ready": "instances", "instances": {"demo": {
        "model": str(path), "max_concurrency": 32, "max_queue": 64,
        "context_tokens": 1536}}}, name="bench-serving")
    try:
        d.start()
        inst = d.instance("demo")
        if inst["ranks"][0]["pid"] is None:
            raise RuntimeError(f"exod's instance did not start: {inst['detail']}")
        runner = int(inst["ranks"][0]["pid"])
        server, srv = start_mlx_lm_server(path)
    except BaseException:
        d.close()
        raise

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


def order(r: int, sides: list[Side]) -> list[Side]:
    """A B in even rounds, B A in odd ones: two rounds make one ABBA."""
    return sides if r % 2 == 0 else sides[::-1]


def warm_up(sides: list[Side]) -> None:
    """First requests pay one-off costs (allocations, compiled kernels): none is timed."""
    for s in sides:
        s.chat([{"role": "user", "content": "warm up"}], max_tokens=4)
        load(s, 8, 1)


def measure(sides: list[Side], rounds: int) -> dict[str, dict[str, list[float]]]:
    """Per side, per figure, one value per round (TTFTs at 8: every request's, pooled).

    Every round runs every figure on both sides back to back, the two sides in the order of
    `order`, so each exod figure has a mlx_lm.server figure taken next to it in time: their
    ratio is what a moment of heavy load on the machine disturbs least."""
    out: dict[str, dict[str, list[float]]] = {s.name: collections.defaultdict(list)
                                              for s in sides}
    for r in range(rounds):
        for name, rate in one_client(sides, WAVES[1], r).items():
            out[name]["rate1"].append(rate)
        for level in LEVELS[1:]:
            for s in order(r, sides):
                rate, ttfts = load(s, level, WAVES[level])
                out[s.name][f"rate{level}"].append(rate)
                if level == 8:
                    out[s.name]["ttft8"] += ttfts
                    out[s.name]["ttft8_median"].append(statistics.median(ttfts))
        # Two new chats per side, ABBA within the round (the same chats on both sides): the
        # second-turn figure showed a strong effect of position (the side that had just run
        # was faster), which a plain A-then-B pair would book to one side.
        turns: dict[str, list[float]] = collections.defaultdict(list)
        for k, s in enumerate([*order(r, sides), *order(r + 1, sides)]):
            turns[s.name].append(second_turn(s, 2 * r + k // len(sides)))
        for name, ts in turns.items():
            out[name]["turn2"].append(statistics.mean(ts))
        print(f"  round {r + 1}/{rounds} done", file=sys.stderr, flush=True)
    return out


def ratios(a: list[float], b: list[float]) -> list[float]:
    """The per-round ratios a/b."""
    return [x / y for x, y in zip(a, b, strict=True)]


def paired(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """(median, lowest, highest) of the per-round ratios a/b."""
    r = ratios(a, b)
    return statistics.median(r), min(r), max(r)


def row(label: str, a: list[float], b: list[float], unit: str, scale: float,
        higher_is_better: bool, at: dict[str, int] | None = None) -> Figure:
    per_round = ratios(a, b)
    return Figure(label, statistics.median(per_round), rounds=per_round, at=at,
                  goal=">= 1.0x" if higher_is_better else "<= 1.0x",
                  sides={"exod": statistics.median(a) * scale,
                         "mlx_lm.server": statistics.median(b) * scale}, side_unit=unit)


def rows(e: dict[str, list[float]], m: dict[str, list[float]],
         peak: dict[str, int]) -> list[Figure]:
    out = [row("aggregate tok/s", e[f"rate{level}"], m[f"rate{level}"], "tok/s", 1.0, True,
               {"clients": level}) for level in LEVELS]
    out.append(row("TTFT median, 8 clients", e["ttft8_median"], m["ttft8_median"], "ms", 1e3,
                   False))
    a, b = pct(e["ttft8"], 0.95), pct(m["ttft8"], 0.95)
    out.append(Figure("TTFT p95, 8 clients (pooled)", a / b, goal="<= 1.0x",
                      sides={"exod": a * 1e3, "mlx_lm.server": b * 1e3}, side_unit="ms"))
    out.append(row("second-turn TTFT, ~1k-token chat", e["turn2"], m["turn2"], "ms", 1e3,
                   False))
    a, b = peak["exod"], peak["mlx_lm.server"]
    out.append(Figure("peak RSS (exod's runner / mlx_lm.server)", a / b, goal="<= 1.0x",
                      sides={"exod": a / 2**20, "mlx_lm.server": b / 2**20}, side_unit="MiB"))
    own = ratios(e["rate8"], e["rate1"])
    out.append(Figure("exod 8 clients / exod 1 client (aggregate)", statistics.median(own),
                      rounds=own))
    return out


def main() -> None:
    path = Path(os.environ["EXOD_BENCH_MODEL"]) if os.environ.get("EXOD_BENCH_MODEL") \
        else demo_model()
    rounds = int(os.environ.get("EXOD_BENCH_ROUNDS") or ROUNDS)
    exod, mlx, close = start_sides(path)
    load_before = os.getloadavg()[0]
    try:
        rss = PeakRss({exod.name: exod.pid, mlx.name: mlx.pid})
        t0 = time.monotonic()
        warm_up([exod, mlx])
        res = measure([exod, mlx], rounds)
        peak = rss.stop()
        took = time.monotonic() - t0
    finally:
        close()
    report(f"serving under load, {path.name}: max_tokens {MAX_TOKENS}, greedy, OpenBLAS on "
           f"both, openai client; {rounds} rounds (ratios: median of the per-round ratios, and "
           f"their range), {took:.0f} s, load average {load_before:.1f} -> "
           f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs",
           rows(res["exod"], res["mlx_lm.server"], peak))


if __name__ == "__main__":
    main()
