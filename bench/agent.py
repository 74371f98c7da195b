"""What agents ask of exod, and what it costs (issue 21): one daemon serving the demo model.

Sections (each prints its ratios against a baseline measured in the same run):

- logprobs: aggregate decode tokens/s with `logprobs: true, top_logprobs: 5` against the same
  requests without logprobs, at 1 and 8 concurrent clients. Goal: at least 0.95x.
- constrained decoding (response_format, forced tool calls), several schemas side by side:
  bench.agent_constrained, run after it (alone: `python -m bench agent_constrained`), then
  bench.grammar_paths (alone: `python -m bench grammar_paths`).

Noise (see bench.serving): the two sides take turns on the same instance, ABBA over
`ROUNDS` rounds (EXOD_BENCH_ROUNDS, default 4); each figure is the median of its per-round
ratios, printed with their range. Aggregate = completion tokens (from `usage`) / wall time from
the first request sent to the last finished. Greedy, so both sides generate the same tokens.

`EXOD_BENCH_MODEL=DIR` benchmarks another model directory (default: the demo model).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai

from bench.api import demo_model
from bench.common import report
from bench import results
from bench.results import Figure
from tests.harness import Daemon

MAX_TOKENS = 64
LEVELS = (1, 8)
ROUNDS = int(os.environ.get("EXOD_BENCH_ROUNDS", "4"))
LOGPROBS_GOAL = 0.95


def start(model: Path) -> tuple[Daemon, openai.OpenAI]:
    d = Daemon({"instances": {"agent": {"model": str(model), "max_concurrency": 8}}},
               name="bench-agent")
    d.start()
    d.until_state("agent", "ready")
    return d, openai.OpenAI(base_url=d.api_url() + "/v1", api_key="-", max_retries=0,
                            timeout=600)


def aggregate(client: openai.OpenAI, clients: int, extra: dict[str, Any]) -> float:
    """Tokens/s of `clients` concurrent streamed chats with `extra` fields."""
    def one(c: int) -> int:
        stream = client.chat.completions.create(
            model="agent", messages=[{"role": "user", "content": f"Tell me about {c + 1} cats."}],
            max_tokens=MAX_TOKENS, temperature=0, stream=True,
            stream_options={"include_usage": True}, **extra)
        tokens = 0
        for chunk in stream:
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        return tokens

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        tokens = sum(pool.map(one, range(clients)))
    return tokens / (time.perf_counter() - t0)


def paired(measure: Callable[[dict[str, Any]], float], side: dict[str, Any],
           base: dict[str, Any]) -> list[float]:
    """Per-round ratios side / base, ABBA."""
    ratios = []
    for r in range(ROUNDS):
        if r % 2 == 0:
            a, b = measure(side), measure(base)
        else:
            b, a = measure(base), measure(side)
        ratios.append(a / b)
    return ratios


def shown(name: str, ratios: list[float], goal: float) -> Figure:
    """The median of per-round ratios, with their range, against a goal of at least `goal`."""
    return Figure(name, statistics.median(ratios), rounds=ratios, goal=f">= {goal}x")


# ---- logprobs on vs off ---------------------------------------------------------------------
def logprobs_section(client: openai.OpenAI) -> list[Figure]:
    rows = []
    on = {"logprobs": True, "top_logprobs": 5}
    for clients in LEVELS:
        aggregate(client, clients, {})  # warm: the first requests compile kernels
        ratios = paired(lambda extra, n=clients: aggregate(client, n, extra), on, {})
        rows.append(shown(f"logprobs on / off, {clients} client(s), tok/s", ratios,
                          LOGPROBS_GOAL))
    return rows


def main() -> None:
    path = Path(os.environ["EXOD_BENCH_MODEL"]) if os.environ.get("EXOD_BENCH_MODEL") \
        else demo_model()
    d, client = start(path)
    try:
        report("agent: logprobs", logprobs_section(client))
    finally:
        d.close()
    from bench import agent_constrained, grammar_paths

    # Each recorded as a bench of its own (bench/results/agent_constrained.jsonl, ...).
    with results.run("agent_constrained"):
        agent_constrained.main()
    with results.run("grammar_paths"):
        grammar_paths.main()


if __name__ == "__main__":
    main()
