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

The load average is printed before and after: on a shared machine it moves the tok/s figures.
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

from bench.agent import ROUNDS, shown
from bench.api import demo_model
from bench.common import report, verdict
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


def paired(measure: Callable[[str], float]) -> tuple[list[float], list[float]]:
    """Per-round ratios q8 / float, ABBA; and q8's own tok/s."""
    ratios, own = [], []
    for r in range(ROUNDS):
        if r % 2 == 0:
            a, b = measure("q8"), measure("float")
        else:
            b, a = measure("float"), measure("q8")
        ratios.append(a / b)
        own.append(a)
    return ratios, own


def speed(c: openai.OpenAI) -> list[tuple[str, str]]:
    rows = []
    for clients in LEVELS:
        for name in ("float", "q8"):
            aggregate(c, name, clients)  # warm: kernels, and the prompts in the prompt cache
        ratios, own = paired(lambda name, n=clients: aggregate(c, name, n))  # type: ignore[misc]
        mid = sorted(own)[len(own) // 2]
        rows.append((f"q8 / float, {clients} client(s), tok/s",
                     f"{shown(ratios, SPEED_GOAL)}; q8 {mid:.1f} tok/s" if clients == 8 else
                     f"{sorted(ratios)[len(ratios) // 2]:.3f}x (rounds {min(ratios):.3f}-"
                     f"{max(ratios):.3f}); q8 {mid:.1f} tok/s"))
    return rows


def kv_bytes(d: Daemon, c: openai.OpenAI) -> tuple[list[tuple[str, str]], str, int]:
    for name in ("float", "q8"):
        d.ctl("cache", "clear", name)
    answers = {name: long_chat(c, name) for name in ("float", "q8")}
    held = {name: prompt_cache(d, name) for name in ("float", "q8")}
    assert all(h["entries"] == 1 for h in held.values()), held
    ratio = held["q8"]["bytes"] / held["float"]["bytes"]
    text, n, _ = answers["q8"]
    return [("KV bytes, q8 / float (one entry of the same tokens)",
             f"{ratio:.3f}x ({held['q8']['bytes']:,} / {held['float']['bytes']:,} bytes, "
             f"{n} prompt tokens; goal <= {BYTES_GOAL}x) {verdict(ratio <= BYTES_GOAL)}")
             ], text, n


def after_restart(d: Daemon, text: str, n: int) -> list[tuple[str, str]]:
    d.until_instance("q8", lambda i: ((i["serving"] or {}).get("prompt_cache") or {}).get(
        "disk", {}).get("entries", 0) >= 1, what="q8's entry on disk")
    assert d.terminate() == 0
    d.start()
    d.until_state("q8", "ready")
    again, n2, cached = long_chat(client(d), "q8")
    disk = prompt_cache(d, "q8")["disk"]
    ok = cached == n - 1 and n2 == n and again == text and disk["hits"] >= 1
    return [("q8 after a restart, the same prompt",
             f"{cached} of {n2} prompt tokens cached, disk hits {disk['hits']}, same answer "
             f"{again == text} {verdict(ok)}")]


def main() -> None:
    path = Path(os.environ["EXOD_BENCH_MODEL"]) if os.environ.get("EXOD_BENCH_MODEL") \
        else demo_model()
    before = os.getloadavg()
    d, c = start(path)
    try:
        rows = speed(c)
        sized, text, n = kv_bytes(d, c)
        rows += sized + after_restart(d, text, n)
    finally:
        d.close()
    after = os.getloadavg()
    rows.append(("load average (1, 5, 15 min)", f"before {before[0]:.1f} {before[1]:.1f} "
                 f"{before[2]:.1f}, after {after[0]:.1f} {after[1]:.1f} {after[2]:.1f}"))
    report("kv: a quantized KV cache in the batch", rows)


if __name__ == "__main__":
    main()
