"""Shared pieces of the benchmarks: models made on demand and cached, timing helpers, report."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from collections.abc import Callable

CACHE = Path(os.environ.get("EXOD_BENCH_CACHE") or Path.home() / ".cache" / "exod-bench")
PY = sys.executable
# The model generators are tests.models.*: run from the checkout, whatever the caller's cwd.
REPO = Path(__file__).resolve().parent.parent


def model(name: str, **params: object) -> Path:
    """A generated model, built once per parameter set (in a subprocess: we never import mlx)."""
    out = CACHE / name
    args = [f"--{k.replace('_', '-')}={v}" for k, v in params.items()]
    res = subprocess.run([PY, "-m", "tests.models.tiny", str(out), *args], capture_output=True,
                         text=True, check=True, cwd=REPO)
    return Path(res.stdout.strip().splitlines()[-1])


def big_model() -> Path:
    from tests.models.tiny import BENCH_PARAMS

    return model("big-1.6g", **BENCH_PARAMS)


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def report(title: str, rows: list[tuple[str, str]]) -> None:
    print(f"\n== {title}")
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"  {k.ljust(width)}  {v}")


def verdict(ok: bool) -> str:
    return "OK" if ok else "MISSED"
