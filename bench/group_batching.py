"""What batching buys a 2-rank group: aggregate decode tokens/s of 8 concurrent clients against
1 client, for a 2-rank pipeline and a 2-rank tensor group of a generated float32 llama (the
demo model's 9 heads do not split in 2). Every rank runs the same batch
(exod.runner.group.lockstep). Printed as a ratio per layout; the 1-client and 8-client runs
alternate over rounds, so load
from elsewhere on the machine falls on both. Part of `python -m bench sharding`;
`python -m bench group_batching` runs it alone.
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import openai

from bench.common import model, report
from bench.results import Figure
from tests.harness import Daemon

ROUNDS = 2
CLIENTS = 8
MAX_TOKENS = 48
LAYOUTS: dict[str, dict[str, object]] = {
    "pipeline": {"shards": 2}, "tensor": {"shards": 2, "parallelism": "tensor"}}
PARAMS = {"layers": 8, "hidden": 512, "intermediate": 1408, "heads": 8, "kv_heads": 4,
          "vocab": 4096}
EOS = "2"  # the generated model's end token, banned: every answer has MAX_TOKENS tokens


def aggregate(c: openai.OpenAI, name: str, clients: int, round_: int) -> float:
    """Completion tokens per second of wall time, `clients` requests at once."""
    def one(i: int) -> int:
        r = c.chat.completions.create(
            model=name, max_tokens=MAX_TOKENS, temperature=0, logit_bias={EOS: -100},
            messages=[{"role": "user", "content": f"Story {round_}.{i}: write a long story "
                                                  f"about a dragon number {i}."}])
        return r.usage.completion_tokens if r.usage else 0

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        tokens = sum(pool.map(one, range(clients)))
    return tokens / (time.perf_counter() - t0)


def rows() -> list[Figure]:
    path = str(model("group-batching-30m", **PARAMS))
    d = Daemon({"ready": "instances", "instances": {
        name: {"model": path, "max_concurrency": CLIENTS, "prompt_cache_bytes": 0, **extra}
        for name, extra in LAYOUTS.items()}}, name="bench-group-batching")
    out: list[Figure] = []
    try:
        d.start()
        c = openai.OpenAI(base_url=d.api_url() + "/v1", api_key="-", max_retries=0,
                          timeout=600)
        for name in LAYOUTS:
            aggregate(c, name, 2, -1)  # warm up
            one: list[float] = []
            many: list[float] = []
            for i in range(ROUNDS):
                one.append(aggregate(c, name, 1, i))
                many.append(aggregate(c, name, CLIENTS, i))
            a, b = statistics.median(one), statistics.median(many)
            out.append(Figure(f"2-rank {name}: {CLIENTS} clients / 1 client (aggregate tok/s)",
                              b / a, sides={f"{CLIENTS} clients": b, "1 client": a},
                              side_unit="tok/s"))
    finally:
        d.close()
    return out


def main() -> None:
    report(f"group batching: 8-layer float32 llama (hidden 512), 2 ranks on loopback, "
           f"{MAX_TOKENS} tokens per request, median of {ROUNDS} rounds", rows())


if __name__ == "__main__":
    main()
