"""Embeddings: exod against mlx-vlm's own server (`python -m mlx_vlm.server --embedding-model`),
started in the same run on the same model, on loopback.

Figures (each printed as exod / mlx-vlm): inputs embedded per second with 1 and 8 concurrent
clients, each request of one input (a search query) or of 16 (a document being indexed); then
the same with a chat model decoding beside the embedding model (exod's chat instance, streaming
continuously from a client of its own, for both sides: the embedder shares the machine with
it), and what that decoding does to exod's own figure (with / without).

Fair play: one model (a MiniLM-L6-shaped BERT of the tiny embedding zoo: 6 layers, hidden 384,
mean pooling, normalized, in float32), OpenBLAS on both (exod's runner preloads it, mlx-vlm's
server gets LD_PRELOAD), plain HTTP clients with keep-alive, `encoding_format: float` (mlx-vlm
writes floats whatever is asked), the same inputs, of 20 to 120 words.

Noise: the machine is shared. Each figure is measured `ROUNDS` times (EXOD_BENCH_ROUNDS) per
side, the sides back to back, in alternating order (ABBA), each side of a round ~1 s of
requests (REQUESTS: 12 a client made a round of 0.4 s, and the 1-client figure moved by 0.15
between runs); the figure is the median of the per-round ratios, printed with their range.
The vectors are checked equal (cosine > 1 - 1e-5) between the two servers first.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import requests

from bench.api import blas_path, demo_model
from bench.common import CACHE, PY, REPO, report, Row
from bench.results import Figure
from tests.harness import Daemon, free_port

ROUNDS = int(os.environ.get("EXOD_BENCH_ROUNDS") or 4)
CLIENTS = (1, 8)
SHAPES = {"1 input": 1, "16 inputs": 16}
REQUESTS = {1: 40, 8: 8}  # per client and round, for each shape: ~1 s a side and round
MINILM = {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12,
          "intermediate_size": 1536, "max_position_embeddings": 512,
          "matryoshka_dimensions": [384]}
GOAL = 1.0


def bench_model() -> Path:
    overrides = [a for k, v in MINILM.items() for a in ("--set", f"{k}={json.dumps(v)}")]
    res = subprocess.run([PY, "-m", "tests.models.embed_zoo", str(CACHE / "embed-minilm"),
                          "bert", *overrides], capture_output=True, text=True, check=True,
                         cwd=REPO)
    return Path(json.loads(res.stdout.strip().splitlines()[-1])["bert"]["path"])


def text(i: int) -> str:
    words = 20 + (i * 37) % 100
    return " ".join(f"w{(i * 13 + k) % 997}" for k in range(words))


@dataclass
class Side:
    name: str
    url: str
    model: str

    def embed(self, session: requests.Session, inputs: list[str]) -> list[list[float]]:
        r = session.post(self.url + "/v1/embeddings", json={
            "model": self.model, "input": inputs, "encoding_format": "float"}, timeout=600)
        r.raise_for_status()
        return [d["embedding"] for d in r.json()["data"]]


def rate(side: Side, clients: int, per_request: int, start: int) -> float:
    """Inputs per second of `clients` clients, each sending REQUESTS[clients] requests."""
    def client(c: int) -> int:
        with requests.Session() as s:
            n = 0
            for k in range(REQUESTS[clients]):
                base = start + (c * 1000 + k) * per_request
                n += len(side.embed(s, [text(base + j) for j in range(per_request)]))
            return n

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        total = sum(pool.map(client, range(clients)))
    return total / (time.perf_counter() - t0)


def start_mlx_vlm(path: Path) -> tuple[subprocess.Popen[str], Side]:
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    blas = blas_path()
    if blas:
        env["LD_PRELOAD"] = blas
    proc = subprocess.Popen([PY, "-m", "mlx_vlm.server", "--embedding-model", str(path),
                             "--host", "127.0.0.1", "--port", str(port), "--log-level",
                             "WARNING"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, text=True)
    side = Side("mlx-vlm", f"http://127.0.0.1:{port}", str(path))
    deadline = time.monotonic() + 300
    with requests.Session() as s:
        while True:
            try:
                side.embed(s, ["ready?"])
                return proc, side
            except (requests.ConnectionError, requests.HTTPError):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"mlx_vlm.server did not start ({proc.poll()})") from None
                time.sleep(0.5)  # polling a server that gives no readiness signal


@contextmanager
def decoding(url: str, model: str) -> Iterator[Callable[[], float]]:
    """A chat client streaming answers from `model` without pause; yields a function that
    tells its tokens per second so far."""
    stop = threading.Event()
    counted = [0]
    t0 = time.perf_counter()

    def run() -> None:
        with requests.Session() as s:
            while not stop.is_set():
                r = s.post(url + "/v1/chat/completions", json={
                    "model": model, "max_tokens": 64, "temperature": 0,
                    "messages": [{"role": "user", "content": "Count to fifty in words."}]},
                    timeout=600)
                r.raise_for_status()
                counted[0] += r.json()["usage"]["completion_tokens"]

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield lambda: counted[0] / (time.perf_counter() - t0)
    finally:
        stop.set()
        thread.join(600)


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def ratios(sides: list[Side], clients: int, per: int, rounds: int) -> tuple[list[float],
                                                                          list[float]]:
    """Per round: exod / mlx-vlm, and exod's own rate; ABBA order."""
    out, own = [], []
    for r in range(rounds):
        order = sides if r % 2 == 0 else sides[::-1]
        got = {s.name: rate(s, clients, per, r * 100_000) for s in order}
        out.append(got["exod"] / got["mlx-vlm"])
        own.append(got["exod"])
    return out, own


def main() -> None:
    path = bench_model()
    chat_model = Path(os.environ["EXOD_BENCH_MODEL"]) if os.environ.get("EXOD_BENCH_MODEL") \
        else demo_model()
    d = Daemon({"api": {"listen": "127.0.0.1:0"},
                "instances": {"emb": {"model": str(path)},
                              "chat": {"model": str(chat_model), "max_concurrency": 2}}})
    d.start()
    proc = None
    try:
        d.watch_until(lambda s: all(i["state"] == "ready" for i in s["instances"]),
                      what="both instances ready")
        proc, vlm = start_mlx_vlm(path)
        sides = [Side("exod", d.api_url(), "emb"), vlm]
        with requests.Session() as s:
            probe = [text(i) for i in range(4)]
            a, b = (side.embed(s, probe) for side in sides)
        same = min(cosine(x, y) for x, y in zip(a, b, strict=True))
        rows: list[Row] = [Figure("vectors equal (min cosine)", same, unit="",
                                  text=f"{same:.7f}")]
        alone: dict[tuple[int, int], list[float]] = {}
        for shape, per in SHAPES.items():
            for clients in CLIENTS:
                r, own = ratios(sides, clients, per, ROUNDS)
                alone[(clients, per)] = own
                rows.append(Figure(f"inputs/s, {clients} client(s), {shape}",
                                   statistics.median(r), rounds=r, goal=f">= {GOAL}x"))
        with decoding(d.api_url(), "chat") as tokens_per_s:
            for shape, per in SHAPES.items():
                for clients in CLIENTS:
                    r, own = ratios(sides, clients, per, ROUNDS)
                    rows.append(Figure(f"with chat decoding: {clients} client(s), {shape}",
                                       statistics.median(r), rounds=r, goal=f">= {GOAL}x"))
                    mine = statistics.median(own) / statistics.median(alone[(clients, per)])
                    rows.append(Figure(f"exod with chat / alone, {clients} client(s), {shape}",
                                       mine))
            rows.append(Figure("chat decoding beside", tokens_per_s(), unit="tok/s"))
        status = next(i for i in d.status()["instances"] if i["name"] == "emb")
        batches = (status["serving"] or {}).get("batches") or {}
        rows.append(("exod's mean batch (inputs per forward pass)",
                     f"{batches.get('mean_batch')}"))
        report("embeddings: exod / mlx_vlm.server (MiniLM-L6-shaped BERT, float32)", rows)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)
        d.close()


if __name__ == "__main__":
    main()
