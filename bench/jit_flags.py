"""mlx's CPU kernels compiled for the machine's instructions (exod.runner.cpu.jit_flags: `-mavx2
-mfma -mf16c`) or as mlx's wheel compiles them, in the same run, alternated over ROUNDS rounds
(ABBA).

Each side is a fresh process set up as a runner is (OpenBLAS, exod's fused decode step), with a
kernel cache of its own kept across rounds (so compiling is not timed), which measures: a GELU
over 48 x 1536 activations (an encoder layer's, one input); an encoder pass over one input of
`embeddings`' MiniLM-shaped BERT (48 tokens; its GELU cut a slice per core, as a runner runs
it); and greedy decoding on the demo model (SmolLM2-135M, float32: its SiLU and exod's fused
rope and norms are compiled kernels), tokens per second. Each side's results (the vectors, the
tokens) are hashed: the two sides must give the same bits. Figures: with / without, the
median of the rounds' ratios, with their range.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile

from bench.api import demo_model
from bench.common import PY, REPO, report
from bench.results import Figure
from bench.embeddings import bench_model

ROUNDS = int(os.environ.get("EXOD_BENCH_ROUNDS") or 3)
GOAL = 1.0  # at least as fast where kernels are much of the work: fewer instructions
UNCHANGED = 0.95  # decoding, where they are little of it: no slower, within the noise

SIDE = r"""
import hashlib, json, statistics, sys, time
from exod.runner.cpu import blas, jit_flags, jit_header
on = sys.argv[1] == "1"
said = jit_flags.install() if on else None
blas.preload()
jit_header.ensure()
import mlx.core as mx, mlx.nn as nn
assert (jit_flags.check() is None) if on else said is None, "flags not installed"
from exod.runner.cpu import fused, split
from exod.facts.embed import encoding
from exod.runner.embed.load import load_encoder
from exod.runner.embed.encoder import Encoder
from mlx_lm import load
from mlx_lm.generate import generate_step

def best(f, n):  # the median of n timed calls, after 3 untimed
    for _ in range(3): f()
    ts = []
    for _ in range(n):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    return statistics.median(ts)

out = {}
x = mx.random.normal((48, 1536), key=mx.random.key(1))
out["gelu"] = best(lambda: mx.eval(nn.gelu(x)), 200)

from pathlib import Path
enc = encoding(Path(sys.argv[2]))
L = load_encoder(Path(sys.argv[2]), enc, dtype="float32", progress=lambda a, b: None,
                 should_stop=lambda: False)
e = Encoder(L.model, enc, 0, split.cores())
ids = L.tokenizer("w1 " * 200, truncation=True)["input_ids"][:48]
vec = e.run_all([([ids], None, [None])])[0][0]
out["encode"] = best(lambda: e.run_all([([ids], None, [None])]), 40)

fused.install()
model, tok = load(sys.argv[3])
prompt = mx.array(tok.encode("Write a short story about a lighthouse keeper."))
def decode(n=48):
    toks = []
    for (t, _), _ in zip(generate_step(prompt, model, max_tokens=n), range(n)):
        toks.append(int(t))
    return toks
tokens = decode()
def tps():
    t = time.perf_counter(); decode(); return 48 / (time.perf_counter() - t)
for _ in range(2): tps()
out["decode"] = statistics.median(tps() for _ in range(5))
out["bits"] = hashlib.sha256(vec + json.dumps(tokens).encode()).hexdigest()
print(json.dumps(out))
"""


def side(on: bool, tmp: str, bert: str, demo: str) -> dict[str, float | str]:
    res = subprocess.run([PY, "-c", SIDE, "1" if on else "0", bert, demo], cwd=REPO,
                         env={**os.environ, "TMPDIR": tmp, "EXOD_JIT_FLAGS": "1"},
                         capture_output=True, text=True, check=True, timeout=900)
    got: dict[str, float | str] = json.loads(res.stdout.strip().splitlines()[-1])
    return got


def main() -> None:
    bert, demo = str(bench_model()), str(demo_model())
    rows: dict[str, list[float]] = {"gelu": [], "encode": [], "decode": []}
    bits: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="exod-bench-jf-on-") as t_on, \
            tempfile.TemporaryDirectory(prefix="exod-bench-jf-off-") as t_off:
        tmp = {True: t_on, False: t_off}
        for on in (True, False):  # compile each side's kernels once, untimed
            side(on, tmp[on], bert, demo)
        for r in range(ROUNDS):
            order = (True, False) if r % 2 == 0 else (False, True)
            got = {on: side(on, tmp[on], bert, demo) for on in order}
            for k in ("gelu", "encode"):  # times: without / with
                rows[k].append(float(got[False][k]) / float(got[True][k]))
            rows["decode"].append(float(got[True]["decode"]) / float(got[False]["decode"]))
            bits |= {str(got[True]["bits"]), str(got[False]["bits"])}
    same = len(bits) == 1

    def row(name: str, k: str, goal: float = GOAL) -> Figure:
        return Figure(name, statistics.median(rows[k]), rounds=rows[k], goal=f">= {goal}x")

    report(f"mlx's CPU kernels built with -mavx2 -mfma -mf16c / as the wheel builds them "
           f"({ROUNDS} rounds)", [
               row("GELU, 48 x 1536 (speed)", "gelu"),
               row("encoder pass, one input of 48 tokens (speed)", "encode"),
               row("decoding, SmolLM2-135M float32 (tokens/s; goal: unchanged)", "decode",
                   UNCHANGED),
               Figure("the same vectors and tokens, every bit", None, text=str(same),
                      met=same),
           ])


if __name__ == "__main__":
    main()
