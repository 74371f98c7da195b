"""What fusing the decode step's rope and norms buys on the CPU (exod.runner.cpu.fused), on the demo
model in float32 with OpenBLAS.

1. In-process, mlx-lm's BatchGenerator with 1 and with 8 requests: the time of a decode step
   with exod's functions over one with mlx's own, the two taking turns every two steps in the
   same generation (ABBA; the second step of each two is timed, as a step waits for the one
   before), so each pair is ~0.4 s apart; the tokens must be those of mlx's own alone (the
   fused ops are bitwise mlx's).
2. Served: two daemons on the same model, one with EXOD_FUSE=0, one client's requests going to
   each in turn: aggregate tokens/s, fused over stock.

Each figure is the median of per-pair ratios, with their range.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from typing import Any

import openai

from bench.api import demo_model
from bench.common import PY, report
from bench.results import Figure
from bench.serving import Side, one_client
from tests.harness import Daemon

STEPS = 240  # decode steps of one generation, the two taking turns every two steps
SERVED_ROUNDS = 4
SERVED_PAIRS = 6

IN_PROCESS = r"""
import json, statistics, sys, time
from exod.runner.cpu.blas import preload
preload()
import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import BatchGenerator
from exod.runner.cpu import fused

model, tok = load(sys.argv[1])
model.set_dtype(mx.float32)
steps = int(sys.argv[2])
prompts = [tok.apply_chat_template([{"role": "user", "content": f"Story {i} about a dragon."}],
                                   add_generation_prompt=True) for i in range(8)]
fused.install()
ours = {n: getattr(mx.fast, n) for n in fused._STOCK}

def use(mode):
    for n in ours:
        setattr(mx.fast, n, ours[n] if mode == "fused" else fused._STOCK[n])

def tokens(width, modes):
    g = BatchGenerator(model, stop_tokens=[], completion_batch_size=32,
                       prefill_batch_size=8, prefill_step_size=256)
    g.insert(prompts[:width], max_tokens=[len(modes) + 1] * width)
    while not g.next()[1]:  # prefill, and the first token
        pass
    times, out = {"fused": [], "stock": []}, []
    for k, mode in enumerate(modes):
        use(mode)
        t0 = time.perf_counter()
        rs = g.next()[1]
        # A call builds the next step's graph and waits for the one before: timed only when
        # both are of the same mode.
        if k and modes[k - 1] == mode:
            times[mode].append(time.perf_counter() - t0)
        out.append([r.token for r in rs])
    return times, out

out = {}
for width in (1, 8):
    tokens(width, ["fused", "stock"] * 4)  # warm: kernels built, buffers allocated
    abba = [("fused", "stock", "stock", "fused")[k // 2 % 4] for k in range(steps)]
    times, mixed = tokens(width, abba)
    _, alone = tokens(width, ["stock"] * steps)
    # Steps next to each other in time, in pairs: what the machine's load does to both.
    ratios = [f / s for f, s in zip(times["fused"], times["stock"])]
    out[width] = {"ratios": ratios, "same": mixed == alone,
                  "ms": statistics.median(times["stock"]) * 1e3}
print(json.dumps(out))
"""


def in_process(path: str) -> list[Figure]:
    import json

    res = subprocess.run([PY, "-c", IN_PROCESS, path, str(STEPS)],
                         capture_output=True, text=True, check=True, timeout=1800)
    got: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    rows: list[Figure] = []
    for width, r in got.items():
        ratios = r["ratios"]
        med = statistics.median(ratios)
        q1, _, q3 = statistics.quantiles(ratios, n=4)
        rows.append(Figure(f"decode step, {width} request(s), fused / mlx's own", med, low=q1,
                           high=q3, goal="< 1.0x", rounds=ratios,
                           text=f"range: the middle half of the pairs; mlx's own "
                                f"{r['ms']:.0f} ms a step"))
        rows.append(Figure(f"same tokens, {width} request(s), taking turns as with mlx's alone",
                           None, text="same" if r["same"] else "different", met=r["same"]))
    return rows


def served(path: str) -> list[Figure]:
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
            rate = one_client(sides, SERVED_PAIRS, r)
            ratios.append(rate["fused"] / rate["stock"])
    finally:
        for d in daemons:
            d.terminate()
            d.close()
    med = statistics.median(ratios)
    return [Figure("served, 1 client, aggregate tok/s fused / EXOD_FUSE=0", med, rounds=ratios,
                   goal="> 1.0x")]


def main() -> None:
    path = str(demo_model())
    rows = in_process(path) + served(path)
    report("fused decode-step rope and norms on the CPU (demo model, float32, OpenBLAS)", rows)


if __name__ == "__main__":
    sys.exit(main())
