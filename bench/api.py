"""Serving: decode tokens/s and time to first token (TTFT, p50/p95) on the same model, in the
same run, for (1) in-process `mlx_lm.stream_generate`, (2) exod's HTTP API, (3) `mlx_lm.server`.

Goals: exod decode ≥ 0.95× in-process; exod TTFT ≤ in-process + 10 ms; exod decode ≥ 1.0×
mlx_lm.server; the hop ≤ 2 ms at the median, at 1 and at 8 clients.

The hop (docs/design/hop.md) is the time a request spends between the client and the runner:
exod's time to a 1-token answer of a short prompt, less mlx-lm's `BatchGenerator` in process on
the same prompts (8 clients: the median client of a burst of 8 started together, against the 8
prompts inserted together), per round, the median over rounds. It runs on a small generated
model, with both sides computing alike (`HOP_ENV`), and clients that keep their connection.

Fair play: every side uses OpenBLAS (the runner preloads it; the other two get it the same way,
or by LD_PRELOAD), float32 weights, greedy sampling, the chat template, and runs alone (the
others are idle or not started). TTFT is measured from the request (for in-process: from the
chat template) to the first generated text; every TTFT prompt is different, so no side can
answer from a cache of the same prompt (mlx_lm.server still reuses the shared prefix: its
prompt cache is part of what it is). Decode rate: tokens after the first, over the time from
the first to the last. Every round runs the same prompts on each side, back to back, in a
rotating order; the goals are judged on the median over rounds of the per-round ratio (decode)
or difference (TTFT), which cancels most of what other load on the machine does to all sides.

`EXOD_BENCH_MODEL=DIR` benchmarks another model directory (default: the demo model).
"""

from __future__ import annotations

import http.client
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import CACHE, PY, Row, model, read_chat_stream, report
from bench.results import Figure
from tests.harness import Daemon, free_port

TTFT_RUNS = 25
TTFT_TOKENS = 4
HOP_ROUNDS = 40  # per number of clients
HOP_CLIENTS = (1, 8)
HOP_GOAL_MS = 2.0
DECODE_RUNS = 8
DECODE_TOKENS = 96
DECODE_PROMPT = "Write a long story about a dragon who learns to cook."


def ttft_prompt(i: int) -> str:
    return f"Question {i}: what is {i} plus {i * 7}? Answer in one short sentence."


def blas_path() -> str | None:
    from exod.runner.cpu.blas import CANDIDATES

    return next((c for c in CANDIDATES if c.startswith("/") and Path(c).exists()), None)


def demo_model() -> Path:
    test_cache = Path(os.environ.get("EXOD_TEST_CACHE") or Path.home() / ".cache" / "exod-test")
    cache = test_cache if (test_cache / "smollm2-135m-instruct").exists() else CACHE
    res = subprocess.run([PY, "-m", "exod.models.demo", "--cache-dir", str(cache)],
                         capture_output=True, text=True, check=True)
    return Path(res.stdout.strip().splitlines()[-1])


# ---- 1. in-process: a worker process that takes one request per stdin line ------------------
IN_PROCESS = r"""
import json, sys, time
from exod.runner.cpu.blas import preload
print(preload()[1], file=sys.stderr)
import mlx.core as mx
from mlx_lm import load, stream_generate
from mlx_lm.sample_utils import make_sampler

model, tok = load(sys.argv[1])
model.set_dtype(mx.float32)  # as exod's runner does on CPU (dtype auto)
greedy = make_sampler(temp=0.0)
print("ready", flush=True)
for line in sys.stdin:
    req = json.loads(line)
    t0 = time.perf_counter()
    prompt = tok.apply_chat_template([{"role": "user", "content": req["content"]}],
                                     add_generation_prompt=True)
    first = last = None
    n = 0
    for r in stream_generate(model, tok, mx.array(prompt), max_tokens=req["max_tokens"],
                             sampler=greedy):
        now = time.perf_counter()
        if first is None and r.text:
            first = now
        last, n = now, r.generation_tokens
    rate = (n - 1) / (last - first) if n > 1 and last > first else None
    print(json.dumps([first - t0, rate]), flush=True)
"""


class InProcess:
    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen([PY, "-c", IN_PROCESS, str(path)], text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env={**os.environ, "HF_HUB_OFFLINE": "1"})
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the in-process worker failed to load the model")

    def run(self, content: str, max_tokens: int) -> tuple[float, float | None]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"content": content, "max_tokens": max_tokens}) + "\n")
        self.proc.stdin.flush()
        ttft, rate = json.loads(self.proc.stdout.readline())
        return float(ttft), rate

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(60)


# ---- the hop's reference: the same prompts through mlx-lm's BatchGenerator, in process --------
# exod's runner serves them with it too (exod.runner.serving.batch_engine), at the same prefill
# step and batch sizes, so what differs is the daemon, the field policy and the channel.
BATCH_IN_PROCESS = r"""
import json, sys, time
from exod.runner.cpu.blas import preload
print(preload()[1], file=sys.stderr)
import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import BatchGenerator
from exod.core.serving import DEFAULT_PREFILL_STEP

model, tok = load(sys.argv[1])
model.set_dtype(mx.float32)  # as exod's runner does on CPU (dtype auto)
width = int(sys.argv[2])
gen = BatchGenerator(model, stop_tokens=[[t] for t in sorted(tok.eos_token_ids)],
                     completion_batch_size=width, prefill_batch_size=min(width, 8),
                     prefill_step_size=DEFAULT_PREFILL_STEP)
print("ready", flush=True)
for line in sys.stdin:
    contents = json.loads(line)
    t0 = time.perf_counter()
    prompts = [tok.apply_chat_template([{"role": "user", "content": c}],
                                       add_generation_prompt=True) for c in contents]
    uids = gen.insert(prompts, max_tokens=[1] * len(prompts))
    first = {}
    while len(first) < len(uids):
        for r in gen.next()[1]:
            first.setdefault(r.uid, time.perf_counter() - t0)
    print(json.dumps([first[u] for u in uids]), flush=True)
"""


class BatchInProcess:
    """mlx-lm's BatchGenerator in a worker process: the time to first token of each of a line's
    prompts, inserted together, 1 token each."""

    def __init__(self, path: Path, width: int) -> None:
        self.proc = subprocess.Popen([PY, "-c", BATCH_IN_PROCESS, str(path), str(width)],
                                     text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env={**os.environ, "HF_HUB_OFFLINE": "1", **HOP_ENV})
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the in-process batch worker failed to load the model")

    def run(self, contents: list[str]) -> list[float]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(contents) + "\n")
        self.proc.stdin.flush()
        return [float(t) for t in json.loads(self.proc.stdout.readline())]

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(60)


# ---- 2 and 3: one HTTP streaming client, the same for exod and mlx_lm.server ----------------
class Http:
    def __init__(self, port: int, model: str, timeout: float = 300) -> None:
        self.port = port
        self.model = model
        self.timeout = timeout  # seconds a request may take (a long prompt's prefill)

    def run(self, content: str, max_tokens: int, system: str | None = None
            ) -> tuple[float, float | None]:
        """(TTFT, decode tokens/s) of one streamed chat completion (after a system message)."""
        turns = [{"role": "system", "content": system}] if system is not None else []
        body = json.dumps({"model": self.model,
                           "messages": [*turns, {"role": "user", "content": content}],
                           "max_tokens": max_tokens, "temperature": 0, "stream": True,
                           "stream_options": {"include_usage": True}})
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
        try:
            t0 = time.perf_counter()
            conn.request("POST", "/v1/chat/completions", body,
                         {"Content-Type": "application/json"})
            resp = conn.getresponse()
            assert resp.status == 200, resp.read()
            got = read_chat_stream(resp)
            first, last = got.first, got.finished or got.last
            n = got.tokens if got.tokens is not None else got.pieces
            assert first is not None and last is not None
            return first - t0, (n - 1) / (last - first) if n > 1 and last > first else None
        finally:
            conn.close()


# The hop's two sides compute alike: the runner's CPU-only tuning off (exod.runner.cpu), so it
# runs what mlx-lm runs in process, and OpenBLAS on one thread on both sides (its threads spin
# while they wait, which on a busy host measures the host rather than the hop).
HOP_ENV = {"EXOD_FUSE": "0", "EXOD_SPLIT": "0", "EXOD_JIT_FLAGS": "0", "OPENBLAS_NUM_THREADS": "1"}


def start_exod(path: Path, width: int | None = None, prompt_cache: bool = True,
               env: dict[str, str] | None = None) -> tuple[Daemon, Http]:
    inst: dict[str, Any] = {"model": str(path)}
    if width is not None:
        inst["max_concurrency"] = width
    if not prompt_cache:
        inst.update(prompt_cache_bytes=0, prompt_cache_disk_bytes=0)
    d = Daemon({"ready": "instances", "instances": {"demo": inst}}, env=env, name="bench-api")
    d.start()  # ready: instances → READY=1 once the model is loaded
    return d, Http(int(d.api_url().rsplit(":", 1)[1]), "demo")


def start_mlx_lm_server(path: Path) -> tuple[subprocess.Popen[str], Http]:
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    blas = blas_path()
    if blas:
        env["LD_PRELOAD"] = blas
    proc = subprocess.Popen([PY, "-m", "mlx_lm.server", "--model", str(path), "--host",
                             "127.0.0.1", "--port", str(port), "--log-level", "INFO"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stderr is not None
    for line in proc.stderr:  # its log says when it listens
        if "Starting httpd" in line:
            break
    else:
        raise RuntimeError(f"mlx_lm.server exited with {proc.wait()}")
    # Keep its log pipe drained from here on, or it could block on a full pipe.
    threading.Thread(target=lambda: [None for _ in proc.stderr or ()], daemon=True).start()
    return proc, Http(port, str(path))


def measure(sides: dict[str, Any]) -> dict[str, dict[str, list[float]]]:
    """Interleaved: each round runs every side once, in a rotating order, so that a slow
    moment of the machine does not fall on one side only."""
    out: dict[str, dict[str, list[float]]] = {k: {"ttft": [], "decode": []} for k in sides}
    names = list(sides)
    for name in names:
        sides[name].run("warm up", 8)
    for i in range(max(TTFT_RUNS, DECODE_RUNS)):
        order = names[i % len(names):] + names[: i % len(names)]
        for name in order:
            if i < TTFT_RUNS:
                out[name]["ttft"].append(sides[name].run(ttft_prompt(i), TTFT_TOKENS)[0])
            if i < DECODE_RUNS:
                rate = sides[name].run(DECODE_PROMPT, DECODE_TOKENS)[1]
                assert rate is not None, f"{name}: fewer than 2 tokens"
                out[name]["decode"].append(rate)
    return out


def hop_prompt(round_: int, client: int) -> str:
    return f"Say one word about the number {round_ * 8 + client}."


class Clients:
    """exod's clients, each on a connection of its own that it keeps from one request to the
    next, as the OpenAI and Anthropic SDKs do."""

    def __init__(self, exod: Http, n: int) -> None:
        self.exod = exod
        self.conns = [self._connect() for _ in range(n)]

    def _connect(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.exod.port, timeout=self.exod.timeout)

    def burst(self, contents: list[str]) -> list[float]:
        """Each content's time to its one token, from as many clients, started together."""
        out = [0.0] * len(contents)
        go = threading.Barrier(len(contents))

        def client(i: int) -> None:
            go.wait()
            out[i] = self.first_token(i, contents[i])

        threads = [threading.Thread(target=client, args=(i,)) for i in range(len(contents))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return out

    def first_token(self, i: int, content: str) -> float:
        """Seconds from client `i`'s request to the chunk that carries its one token (its text,
        or the finish reason where the token shows no text)."""
        body = json.dumps({"model": self.exod.model, "max_tokens": 1, "temperature": 0,
                           "stream": True, "messages": [{"role": "user", "content": content}]})
        for attempt in (1, 2):  # once more on a new connection, if the kept one was closed
            try:
                t0 = time.perf_counter()
                self.conns[i].request("POST", "/v1/chat/completions", body,
                                      {"Content-Type": "application/json"})
                resp = self.conns[i].getresponse()
                break
            except (http.client.RemoteDisconnected, ConnectionError):
                self.conns[i].close()
                self.conns[i] = self._connect()
                if attempt == 2:
                    raise
        assert resp.status == 200, resp.read()
        first = None
        while line := resp.readline():  # to the body's end: the connection is used again
            if first is None and line.startswith(b"data: {"):
                choice = (json.loads(line[6:]).get("choices") or [{}])[0]
                if (choice.get("delta") or {}).get("content") or choice.get("finish_reason"):
                    first = time.perf_counter() - t0
        assert first is not None, "no token came"
        return first

    def close(self) -> None:
        for conn in self.conns:
            conn.close()


def measure_hop(path: Path) -> dict[int, list[float]]:
    """The hop at each number of clients: per round, the median of the clients' times to first
    token through exod, less the median of the same prompts' through mlx-lm's BatchGenerator in
    process (inserted together). The two sides run back to back, in turns; exod's prompt cache
    and CPU tuning are off (the reference has neither), so both compute the same."""
    width = max(HOP_CLIENTS)
    batch = BatchInProcess(path, width)
    daemon, exod = start_exod(path, width=width, prompt_cache=False, env=HOP_ENV)
    clients = Clients(exod, width)
    out: dict[int, list[float]] = {n: [] for n in HOP_CLIENTS}
    try:
        for n in HOP_CLIENTS:  # a warm-up for each burst's shape
            batch.run([hop_prompt(0, c) for c in range(n)])
            clients.burst([hop_prompt(0, c) for c in range(n)])
        for i in range(1, HOP_ROUNDS + 1):
            for n in HOP_CLIENTS:
                contents = [hop_prompt(i, c) for c in range(n)]
                if i % 2:
                    ours, ref = clients.burst(contents), batch.run(contents)
                else:
                    ref, ours = batch.run(contents), clients.burst(contents)
                out[n].append(statistics.median(ours) - statistics.median(ref))
    finally:
        clients.close()
        batch.close()
        daemon.terminate()
        daemon.close()
    return out


def hop_figures(hops: dict[int, list[float]]) -> list[Figure]:
    """The hop at each number of clients: the median over rounds, in ms, with their range."""
    return [Figure("hop: exod TTFT − in-process (1 token, short prompt)",
                   statistics.median(xs) * 1e3, unit="ms", goal=f"<= {HOP_GOAL_MS:g} ms",
                   rounds=[x * 1e3 for x in xs], at={"clients": n})
            for n, xs in hops.items()]


def paired_ratio(a: list[float], b: list[float]) -> float:
    """Median over rounds of a[i] / b[i]: both ran in the same round, back to back."""
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def main() -> None:
    path = Path(os.environ["EXOD_BENCH_MODEL"]) if os.environ.get("EXOD_BENCH_MODEL") \
        else demo_model()
    inproc = InProcess(path)
    daemon, exod = start_exod(path)
    server, srv = start_mlx_lm_server(path)
    try:
        results = measure({"in-process": inproc, "exod": exod, "mlx_lm.server": srv})
    finally:
        inproc.close()
        daemon.terminate()
        daemon.close()
        server.terminate()
        server.wait(60)
    rows: list[Row] = []
    best: dict[str, float] = {}
    ttft50: dict[str, float] = {}
    for name, r in results.items():
        t, d = r["ttft"], r["decode"]
        best[name] = max(d)
        ttft50[name] = pct(t, 0.5)
        line = (f"decode best {best[name]:5.1f} median {statistics.median(d):5.1f} tok/s   "
                f"TTFT p50 {pct(t, 0.5) * 1e3:6.1f} ms  p95 {pct(t, 0.95) * 1e3:6.1f} ms")
        rows.append((name, line))
    ratio_in = paired_ratio(results["exod"]["decode"], results["in-process"]["decode"])
    ratio_srv = paired_ratio(results["exod"]["decode"], results["mlx_lm.server"]["decode"])
    # Round i ran the same prompt on every side within a second: the paired differences cancel
    # most of what the rest of the machine does to both (a p50 difference would not).
    pairs = [e - i for e, i in zip(results["exod"]["ttft"], results["in-process"]["ttft"],
                                   strict=True)]
    extra = statistics.median(pairs) * 1e3
    rows += [
        Figure("exod / in-process decode (median of pairs)", ratio_in, goal=">= 0.95x"),
        Figure("exod TTFT − in-process (median of pairs)", extra, unit="ms", goal="<= 10 ms",
               text=f"p50s: {(ttft50['exod'] - ttft50['in-process']) * 1e3:+.1f} ms"),
        Figure("exod / mlx_lm.server decode (median of pairs)", ratio_srv, goal=">= 1.0x"),
    ]
    # A model of 4 small layers: its few milliseconds of compute leave the hop in plain sight
    # (the hop does not depend on the model; a big model's noise would hide it).
    rows += hop_figures(measure_hop(model("tiny-4")))
    report(f"serving {path.name}: {TTFT_RUNS} TTFT runs ({TTFT_TOKENS} tokens) and "
           f"{DECODE_RUNS} decode runs ({DECODE_TOKENS} tokens) per side, interleaved, greedy, "
           f"OpenBLAS {'on' if blas_path() else 'NOT FOUND'} on every side", rows)


if __name__ == "__main__":
    sys.exit(main())
