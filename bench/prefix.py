"""Shared prefixes prefilled once (docs/api.md, "Shared prefixes, prefilled once").

8 cold requests that share a prefix of ~6k tokens (a team's agents: the same system prompt and
tools) and differ after it arrive at once. The figure is the time until all 8 have their first
token, against the time to first token of one such request alone: goal <= 2.0x (without
sharing, the 8 prefill the prefix 8 times: ~8x). `mlx_lm.server` on the same bursts beside it.
A generated 4-layer model on both sides (the demo model takes minutes a lone 6k prompt on a
2-core CPU, and mlx_lm.server's burst eight times that); each round's prompts open with a word
of their own, so every burst and every lone request is cold in both servers' prompt caches.
Rounds in ABBA order (EXOD_BENCH_ROUNDS, default 2); each figure is the median of the rounds'
ratios.
"""

from __future__ import annotations

import os
import statistics
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import openai

from bench.api import start_mlx_lm_server
from bench.common import model
from bench.common import report
from bench.results import Figure, note
from tests.harness import Daemon

BURST = 8
ROUNDS = 2
GOAL = 2.0


def system_prompt(salt: str) -> str:
    """~6k tokens of an agent's rules and tools; `salt` first, so no cache holds it yet."""
    tools = " ".join(f"Tool {k}: read_file_{k}(path: str, start: int, end: int) returns lines "
                     f"{k * 3} to {k * 3 + 40} of the file, or an error naming the path."
                     for k in range(115))
    return f"Session {salt}. You are a careful coding agent. {tools}"


@dataclass
class Side:
    name: str
    client: openai.OpenAI
    model: str

    def first_token(self, system: str, question: str) -> tuple[float, int]:
        """(seconds to the first token, prompt tokens) of one streamed chat."""
        t0 = time.perf_counter()
        stream = self.client.chat.completions.create(
            model=self.model, max_tokens=4, temperature=0, stream=True,
            stream_options={"include_usage": True},
            messages=[{"role": "system", "content": system},
                      {"role": "user", "content": question}])
        first, prompt = None, 0
        for chunk in stream:
            if chunk.usage is not None:
                prompt = chunk.usage.prompt_tokens
            if first is None and any(c.delta.content for c in chunk.choices):
                first = time.perf_counter() - t0
        assert first is not None, f"{self.name}: no text"
        return first, prompt

    def alone(self) -> tuple[float, int]:
        return self.first_token(system_prompt(uuid.uuid4().hex), "Which tool reads line 7?")

    def burst(self) -> float:
        """Seconds from the burst's start until its last request has its first token."""
        system = system_prompt(uuid.uuid4().hex)
        t0 = time.perf_counter()

        def one(i: int) -> float:
            self.first_token(system, f"Agent {i}: which tool reads line {i * 11}?")
            return time.perf_counter() - t0

        with ThreadPoolExecutor(BURST) as pool:
            return max(pool.map(one, range(BURST)))


def start(path: Any) -> tuple[list[Side], Any]:
    d = Daemon({"ready": "instances", "instances": {"demo": {
        "model": str(path), "max_concurrency": BURST, "context_tokens": 8192}}},
        name="bench-prefix")
    d.start()
    server, srv = start_mlx_lm_server(path)

    def client(url: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=url + "/v1", api_key="-", max_retries=2, timeout=1800)

    sides = [Side("exod", client(d.api_url()), "demo"),
             Side("mlx_lm.server", client(f"http://127.0.0.1:{srv.port}"), srv.model)]

    def close() -> None:
        d.terminate()
        d.close()
        server.terminate()
        server.wait(60)

    return sides, close


def main() -> None:
    rounds = int(os.environ.get("EXOD_BENCH_ROUNDS") or ROUNDS)
    sides, close = start(model("prefix-4x256", layers=4, hidden=256, intermediate=768,
                                     heads=4, kv_heads=2))
    got: dict[str, dict[str, list[float]]] = {s.name: {"alone": [], "burst": []} for s in sides}
    tokens = 0
    try:
        for s in sides:  # each side builds its kernels before anything is timed
            s.first_token("Hello.", "Hi.")
        for r in range(rounds):
            for s in sides if r % 2 == 0 else sides[::-1]:
                alone, tokens = s.alone()
                got[s.name]["alone"].append(alone)
                got[s.name]["burst"].append(s.burst())
    finally:
        close()
    med = {name: {k: statistics.median(v) for k, v in g.items()} for name, g in got.items()}
    figures: list[Any] = []
    for name, g in got.items():
        ratios = [b / a for a, b in zip(g["alone"], g["burst"], strict=True)]
        mine = name == "exod"
        bars = {f"burst of {BURST}": med[name]["burst"], "one alone": med[name]["alone"]}
        if mine:  # the plot's bars: mlx_lm.server's burst beside exod's
            bars[f"mlx_lm.server burst of {BURST}"] = med["mlx_lm.server"]["burst"]
        figures.append(Figure(
            f"burst of {BURST} / one alone" + ("" if mine else f", {name}"),
            statistics.median(ratios), rounds=ratios, goal=f"<= {GOAL}x" if mine else None,
            sides=bars, side_unit="s",
            text=f"burst {med[name]['burst']:.2f} s, alone {med[name]['alone']:.2f} s"))
    note(f"{BURST} requests at once sharing a {tokens}-token prompt but for their last words; "
         f"{rounds} rounds")
    report(f"prefix: {BURST} cold requests sharing a ~{tokens}-token prefix, all first tokens "
           "vs one alone", figures)


if __name__ == "__main__":
    main()
