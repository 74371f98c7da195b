"""A quantized KV cache in the continuous batch (issue 47): one daemon serving the demo model
twice, `float` (a float cache) and `q8` (`kv_bits: 8`, `quantized_kv_start: 0`, so every
request's cache is quantized), both batching, with their prompt cache.

- tok/s: aggregate decode tokens/s of `q8` against `float`, at 1 and 8 concurrent clients, the
  two instances taking turns, ABBA over `ROUNDS` rounds (EXOD_BENCH_ROUNDS, default 4); each
  figure is the median of its per-round ratios, printed with their range. Goal at 8 clients:
  >= 0.9x.
- KV bytes: the RAM tier's bytes after one and the same ~1k-token prompt on each instance (one
  entry each, of the same tokens). Goal: <= 0.6x.
- after a restart: the same prompt on `q8` is read from its disk tier (`usage` counts every
  prompt token but the last as cached, status counts a disk hit).

The run records the load average before and after (bench.results): on a shared machine it
moves the tok/s figures.
`EXOD_BENCH_MODEL=DIR` benchmarks another model directory (default: the demo model).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai

import statistics

from bench.agent import ROUNDS
from bench.api import demo_model
from bench.common import report
from bench.results import Figure
from tests.harness import Daemon

MAX_TOKENS = 64
LEVELS = (1, 8)
SPEED_GOAL = 0.9  # at 8 clients
BYTES_GOAL = 0.6
LONG = "Summarise this for a new engineer. " + "The service restarts its workers in order. " * 120


def start(model: Path) -> tuple[Daemon, openai.OpenAI]:
    common = {"model": str(model), "max_concurrency": 8}
    d = Daemon({"instances": {
        "float": common,
        "q8": {**common, "kv_bits": 8, "kv_group_size": 64, "quantized_kv_start": 0},
    }}, name="bench-kv")
    d.start()
    for name in ("float", "q8"):
        d.until_state(name, "ready")
    return d, client(d)


def client(d: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=d.api_url() + "/v1", api_key="-", max_retries=0, timeout=600)


def aggregate(c: openai.OpenAI, model: str, clients: int) -> float:
    """Tokens/s of `clients` concurrent greedy chats, each a prompt of its own."""
    def one(i: int) -> int:
        r = c.chat.completions.create(
            model=model, messages=[{"role": "user", "content": f"Tell me about {i + 1} cats."}],
            max_tokens=MAX_TOKENS, temperature=0, logit_bias={"2": -100})
        assert r.usage is not None
        return r.usage.completion_tokens

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        tokens = sum(pool.map(one, range(clients)))
    return tokens / (time.perf_counter() - t0)


def long_chat(c: openai.OpenAI, model: str) -> tuple[str, int, int]:
    r = c.chat.completions.create(model=model, messages=[{"role": "user", "content": LONG}],
                                  max_tokens=1, temperature=0)
    assert r.usage is not None and r.usage.prompt_tokens_details is not None
    return (r.choices[0].message.content or "", r.usage.prompt_tokens,
            r.usage.prompt_tokens_details.cached_tokens or 0)


def prompt_cache(d: Daemon, name: str) -> dict[str, Any]:
    got = d.until_instance(name, lambda i: (i["serving"] or {}).get("prompt_cache") is not None,
                           what=f"{name}'s prompt cache")["serving"]["prompt_cache"]
    return dict(got)


def paired(measure: Callable[[str], float]) -> tuple[list[float], list[float], list[float]]:
    """Per-round ratios q8 / float, ABBA; and each side's own tok/s."""
    ratios, q8, floats = [], [], []
    for r in range(ROUNDS):
        if r % 2 == 0:
            a, b = measure("q8"), measure("float")
        else:
            b, a = measure("float"), measure("q8")
        ratios.append(a / b)
        q8.append(a)
        floats.append(b)
    return ratios, q8, floats


def speed(c: openai.OpenAI) -> list[Figure]:
    rows = []
    for clients in LEVELS:
        for name in ("float", "q8"):
            aggregate(c, name, clients)  # warm: kernels, and the prompts in the prompt cache
        ratios, q8, floats = paired(
            lambda name, n=clients: aggregate(c, name, n))  # type: ignore[misc]
        rows.append(Figure("q8 / float, aggregate tok/s", statistics.median(ratios),
                           rounds=ratios, goal=f">= {SPEED_GOAL}x" if clients == 8 else None,
                           sides={"q8": statistics.median(q8),
                                  "float": statistics.median(floats)},
                           side_unit="tok/s", at={"clients": clients}))
    return rows


def kv_bytes(d: Daemon, c: openai.OpenAI) -> tuple[Figure, str, int]:
    for name in ("float", "q8"):
        d.ctl("cache", "clear", name)
    answers = {name: long_chat(c, name) for name in ("float", "q8")}
    held = {name: prompt_cache(d, name) for name in ("float", "q8")}
    assert all(h["entries"] == 1 for h in held.values()), held
    text, n, _ = answers["q8"]
    return Figure("KV bytes, q8 / float", held["q8"]["bytes"] / held["float"]["bytes"],
                  goal=f"<= {BYTES_GOAL}x", side_unit="bytes",
                  sides={name: float(h["bytes"]) for name, h in held.items()},
                  text=f"one entry of the same {n} prompt tokens"), text, n


def after_restart(d: Daemon, text: str, n: int) -> Figure:
    d.until_instance("q8", lambda i: ((i["serving"] or {}).get("prompt_cache") or {}).get(
        "disk", {}).get("entries", 0) >= 1, what="q8's entry on disk")
    assert d.terminate() == 0
    d.start()
    d.until_state("q8", "ready")
    again, n2, cached = long_chat(client(d), "q8")
    disk = prompt_cache(d, "q8")["disk"]
    return Figure("q8 after a restart, prompt tokens read from disk", cached, unit="tokens",
                  goal=f">= {n - 1}", met=cached == n - 1 and n2 == n and again == text
                  and disk["hits"] >= 1,
                  text=f"of {n2}; disk hits {disk['hits']}; the cold answer: {again == text}")


def main() -> None:
    path = Path(os.environ["EXOD_BENCH_MODEL"]) if os.environ.get("EXOD_BENCH_MODEL") \
        else demo_model()
    before = os.getloadavg()
    d, c = start(path)
    try:
        rows = speed(c)
        sized, text, n = kv_bytes(d, c)
        rows += [sized, after_restart(d, text, n)]
    finally:
        d.close()
    report("kv: a quantized KV cache in the batch", rows)
    print(f"  load average before {before[0]:.1f}, after {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
