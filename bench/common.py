"""Shared pieces of the benchmarks: models made on demand and cached, timing helpers, report
(which also records each figure: bench.results)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import results
from bench.results import Figure

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


Row = tuple[str, str] | Figure


def report(title: str, rows: Sequence[Row]) -> None:
    """Prints a section of rows, and records them in the run in progress (bench.results): a
    Figure as it is, a plain (label, text) row as a figure with its text only."""
    print(f"\n== {title}")
    figures = [r if isinstance(r, Figure) else Figure(r[0], None, unit="", text=r[1])
               for r in rows]
    width = max(len(f.label()) for f in figures)
    for f in figures:
        print(f"  {f.label().ljust(width)}  {f.line()}")
    results.add(*figures, section=title)


def verdict(ok: bool) -> str:
    return "OK" if ok else "MISSED"


@dataclass
class Streamed:
    """A chat completions stream read to its end. Times are time.perf_counter()'s."""

    first: float | None  # the first piece of text came
    last: float | None  # the last piece of text came
    finished: float | None  # the finish reason came
    pieces: int  # chunks with text
    tokens: int | None  # the usage's completion_tokens, when sent
    text: str


def read_chat_stream(resp: Any) -> Streamed:
    """An OpenAI chat completions SSE body (an http.client response), read to `[DONE]`."""
    first = last = finished = None
    pieces, tokens, text = 0, None, []
    while line := resp.readline():
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        chunk = json.loads(data)
        now = time.perf_counter()
        if chunk.get("usage"):
            tokens = chunk["usage"].get("completion_tokens") or tokens
        for choice in chunk.get("choices") or []:
            piece = (choice.get("delta") or {}).get("content")
            if piece:
                text.append(piece)
                pieces += 1
                first = first or now
                last = now
            if choice.get("finish_reason"):
                finished = now
    return Streamed(first, last, finished, pieces, tokens, "".join(text))
