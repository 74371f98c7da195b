"""The client of `bench cluster`'s proxy figure, run where the nodes are reached (inside a test
host's network namespace, or beside loopback daemons): streamed chats to each side in ABBA
rounds, one JSON line out: each side's (time to first token, tok/s) of every request, by
round and pair.

    python -m bench.cluster_client '{"sides": {NAME: URL, ...}, "key": SECRET, "model": M,
                                     "rounds": R, "per": K, "max_tokens": N}'
"""

from __future__ import annotations

import http.client
import json
import sys
import time
from typing import Any
from urllib.parse import urlsplit

from bench.common import read_chat_stream

EOS = "2"  # the generated models' end token: banned, every answer is max_tokens long


def one(url: str, key: str, model: str, max_tokens: int, words: str) -> tuple[float, float]:
    """(seconds to the first token, tokens a second after it) of one streamed chat."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=600)
    body = {"model": model, "messages": [{"role": "user", "content": words}],
            "max_tokens": max_tokens, "temperature": 0, "logit_bias": {EOS: -100},
            "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(body),
                 {"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    got = read_chat_stream(resp)
    conn.close()
    assert got.first is not None and got.last is not None and got.tokens == max_tokens, got
    return got.first - t0, (max_tokens - 1) / (got.last - got.first)


def main() -> None:
    args: dict[str, Any] = json.loads(sys.argv[1])
    sides: dict[str, str] = args["sides"]
    for url in sides.values():  # warm: kernels built, connections to the other node made
        one(url, args["key"], args["model"], 8, "warm up")
    # Each round: `per` pairs, one request to each side back to back, in ABBA order (a burst
    # of load elsewhere on the machine falls on both sides of a pair).
    out: dict[str, list[list[list[float]]]] = {n: [] for n in sides}  # round, pair: ttft, tps
    order = list(sides)
    for r in range(args["rounds"]):
        for name in sides:
            out[name].append([])
        for k in range(args["per"]):
            for name in order if (r * args["per"] + k) % 2 == 0 else order[::-1]:
                out[name][-1].append(list(one(sides[name], args["key"], args["model"],
                                              args["max_tokens"], f"round {r} pair {k}")))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
