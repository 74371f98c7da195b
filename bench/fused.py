"""What fusing the decode step's rope and norms buys on the CPU (exod.runner.fused), on the demo
model in float32 with OpenBLAS.

1. In-process, mlx-lm's BatchGenerator with 1 and with 8 requests: milliseconds per decode
   step with mlx's own functions and with exod's, the two taking turns run by run in one
   process (the tokens must be the same: the fused ops are bitwise mlx's).
2. Served: two daemons on the same model, one with EXOD_FUSE=0, one client's requests going to
   each in turn: aggregate tokens/s, fused over stock.

Each figure is the median of per-pair ratios, with their range.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from typing import Any

import openai

from bench.api import demo_model
from bench.common import PY, report, verdict
from bench.serving import Side, order, question
from tests.harness import Daemon

PAIRS = 8
STEPS = 48
SERVED_ROUNDS = 4
SERVED_PAIRS = 6

IN_PROCESS = r"""
import json, statistics, sys, time
from exod.runner.blas import preload
preload()
import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import BatchGenerator
from exod.runner import fused

model, tok = load(sys.argv[1])
model.set_dtype(mx.float32)
pairs, steps = int(sys.argv[2]), int(sys.argv[3])
prompts = [tok.apply_chat_template([{"role": "user", "content": f"Story {i} about a dragon."}],
                                   add_generation_prompt=True) for i in range(8)]
fused.install()
ours = {n: getattr(mx.fast, n) for n in fused._STOCK}

def use(mode):
    for n in ours:
        setattr(mx.fast, n, ours[n] if mode == "fused" else fused._STOCK[n])

def run(width):
    g = BatchGenerator(model, stop_tokens=[], completion_batch_size=32,
                       prefill_batch_size=8, prefill_step_size=256)
    g.insert(prompts[:width], max_tokens=[steps] * width)
    times, tokens = [], []
    while len(times) < steps:
        _, rs = g.next()
        if rs:
            times.append(time.perf_counter())
            tokens.append([r.token for r in rs])
    return (times[-1] - times[1]) / (steps - 2), tokens

out = {}
for width in (1, 8):
    for mode in ("fused", "stock"):
        use(mode); run(width)  # warm: kernels compiled, buffers allocated
    ratios, same = [], True
    for p in range(pairs):
        got = {}
        for mode in (("fused", "stock") if p % 2 == 0 else ("stock", "fused")):
            use(mode)
            got[mode] = run(width)
        same &= got["fused"][1] == got["stock"][1]
        ratios.append(got["fused"][0] / got["stock"][0])
    out[width] = {"ratios": ratios, "same": same, "ms": got["stock"][0] * 1e3}
print(json.dumps(out))
"""


def in_process(path: str) -> list[tuple[str, str]]:
    import json

    res = subprocess.run([PY, "-c", IN_PROCESS, path, str(PAIRS), str(STEPS)],
                         capture_output=True, text=True, check=True, timeout=1800)
    got: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    rows = []
    for width, r in got.items():
        ratios = r["ratios"]
        med = statistics.median(ratios)
        rows.append((f"decode step, {width} request(s), fused / mlx's own",
                     f"{med:.3f}x (pairs {min(ratios):.3f}-{max(ratios):.3f}; mlx's own "
                     f"{r['ms']:.0f} ms)  (goal < 1.0x) {verdict(med < 1.0)}"))
        rows.append((f"  same tokens, {width} request(s)", verdict(r["same"])))
    return rows


def served(path: str) -> list[tuple[str, str]]:
    sides: list[Side] = []
    daemons: list[Daemon] = []
    try:
        for name, env in (("fused", {}), ("stock", {"EXOD_FUSE": "0"})):
            d = Daemon({"ready": "instances", "instances": {"demo": {
                "model": path, "max_concurrency": 8, "context_tokens": 1536}}},
                env=env, name=f"bench-fused-{name}")
            daemons.append(d)
            d.start()
            client = openai.OpenAI(base_url=d.api_url() + "/v1", api_key="-", max_retries=2)
            sides.append(Side(name, client, "demo", 0))
        for s in sides:
            s.chat([{"role": "user", "content": "warm up"}], max_tokens=4)
        ratios = []
        for r in range(SERVED_ROUNDS):
            tokens = dict.fromkeys((s.name for s in sides), 0)
            wall = dict.fromkeys(tokens, 0.0)
            for w in range(SERVED_PAIRS):
                for s in order(r + w, sides):
                    t0 = time.perf_counter()
                    res, _ = s.chat([{"role": "user", "content": question(r * 100 + w)}])
                    wall[s.name] += time.perf_counter() - t0
                    tokens[s.name] += res.tokens
            ratios.append((tokens["fused"] / wall["fused"]) / (tokens["stock"] / wall["stock"]))
    finally:
        for d in daemons:
            d.terminate()
            d.close()
    med = statistics.median(ratios)
    return [("served, 1 client, aggregate tok/s fused / EXOD_FUSE=0",
             f"{med:.3f}x (rounds {min(ratios):.3f}-{max(ratios):.3f})  (goal > 1.0x) "
             f"{verdict(med > 1.0)}")]


def main() -> None:
    path = str(demo_model())
    rows = in_process(path) + served(path)
    report("fused decode-step rope and norms on the CPU (demo model, float32, OpenBLAS)", rows)


if __name__ == "__main__":
    sys.exit(main())
