"""mlx's CPU kernels compiled against a precompiled header (exod.runner.cpu.jit_header) or
without one, in the same run, alternated over ROUNDS rounds (ABBA).

Each side is a fresh process with a kernel cache of its own (TMPDIR), which compiles KERNELS
distinct fused kernels (mx.compile of elementwise chains, as mlx-lm's activations and exod's
fused decode step are); the figure is the CPU-seconds of the compiler (the process's reaped
children) per kernel, with / without. Goal <= 0.5x. Also printed: what building the header
costs, in kernels' worth of compiling without it.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile

from bench.common import PY, REPO, report
from bench.results import Figure

ROUNDS = int(os.environ.get("EXOD_BENCH_ROUNDS") or 2)
KERNELS = 12
GOAL = 0.5

SIDE = """
import json, resource, sys
from exod.runner.cpu import jit_header
import mlx.core as mx

def children():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime

OPS = (mx.exp, mx.sigmoid, mx.tanh, mx.abs, mx.square, mx.negative)

def chain(k):
    def f(a, b):
        for digit in (k % 6, k // 6 % 6, k // 36 % 6):
            a = OPS[digit](a) * b + 0.5
        return a
    return f

t0 = children()
built = jit_header.ensure() if sys.argv[1] == "1" else None
t1 = children()
a, b = mx.ones((64,)), mx.full((64,), 0.25)
for k in range(int(sys.argv[2])):
    mx.eval(mx.compile(chain(k * 7 + 1))(a, b))
print(json.dumps({"built": built, "build": t1 - t0, "kernels": children() - t1}))
"""


def side(with_header: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="exod-bench-jit-") as tmp:
        res = subprocess.run([PY, "-c", SIDE, "1" if with_header else "0", str(KERNELS)],
                             cwd=REPO, env={**os.environ, "TMPDIR": tmp}, capture_output=True,
                             text=True, check=True, timeout=900)
    got: dict[str, float] = json.loads(res.stdout.strip().splitlines()[-1])
    if with_header and not got["built"]:
        raise RuntimeError("the header was not built: nothing to measure (no g++? not Linux?)")
    return got


def main() -> None:
    ratios, builds, without = [], [], []
    for r in range(ROUNDS):
        order = (True, False) if r % 2 == 0 else (False, True)
        got = {w: side(w) for w in order}
        ratios.append(got[True]["kernels"] / got[False]["kernels"])
        builds.append(got[True]["build"])
        without.append(got[False]["kernels"] / KERNELS)
    ratio = statistics.median(ratios)
    per_kernel = statistics.median(without)
    report(f"mlx's CPU kernels: with a precompiled header / without ({KERNELS} kernels, "
           f"{ROUNDS} rounds)", [
               Figure("compiler CPU per kernel", ratio, rounds=ratios, goal=f"<= {GOAL}x"),
               Figure("without: CPU-s per kernel", per_kernel, unit="CPU-s"),
               Figure("building the header (once per machine and mlx version)",
                      statistics.median(builds), unit="CPU-s",
                      text=f"{statistics.median(builds) / per_kernel:.1f} kernels without it"),
           ])


if __name__ == "__main__":
    main()
