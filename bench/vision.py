"""Models that see, served: exod's HTTP API beside mlx-vlm's own server (`mlx_vlm.server`, on
loopback), in one run, on the same model and pictures. The model is a mid-sized random
Qwen2.5-VL made by the vision zoo (8 layers of width 512; an 8-layer tower of width 256 seeing
224x224 pictures: 256 patches, 64 image tokens), float32, OpenBLAS on both sides (the runner
loads it; mlx-vlm's server gets it by LD_PRELOAD), greedy, every answer N tokens (the zoo's
models never say their end token). Each figure is exod's over mlx-vlm's (for a time, mlx-vlm's
over exod's), so above 1.0 exod is better; the goal is >= 1.0x:

1. time to first token of one client's request (a picture and a question, streamed);
2. tokens/s of 1 client (those requests, from the request to the last token), and aggregate
   tokens/s of 8 clients at once (8 pictures);
3. the second turn's time to first token: the first turn's answer sent back with a question
   about the same picture;
4. CPU seconds per answered token over a round, every process of each side (exod's daemon and
   runner, mlx-vlm's server): on a shared machine, what a side costs is steadier than how
   long it took.

Every request shows a picture no side has seen yet (its own seed), but (3)'s, so no side answers
from a cache, except the second turn, which is the point of (3). mlx-vlm's server runs as it
comes (its prefix cache, APC, is off unless APC_ENABLED=1; `EXOD_BENCH_APC=1` turns it on for
this run). The sides take turns over ROUNDS rounds (EXOD_BENCH_ROUNDS, 10 unless set). One
client's requests (1, 2) alternate request by request, the side that leads turned each time, and
each pair's ratio compares two requests made seconds apart: a shared machine's speed moves over
seconds, and whole rounds of one side, then the other, spread the per-round ratios of sides that
were even when pooled (docs/benchmarks.md, the history in bench/results/vision.jsonl). Those
figures are the median of the pairs' ratios with their middle half; the others
(2's 8 clients, 3, 4) the median of the rounds' ratios with their range, the side that starts a
round turned each round. Both sides' answers to the first request must be the same text.
`python -m bench vision`.
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
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench.api import blas_path
from bench.common import CACHE, PY, REPO, read_chat_stream, report
from bench.results import Figure
from tests.harness import Daemon, cpu_seconds, free_port

ROUNDS = int(os.environ.get("EXOD_BENCH_ROUNDS") or 10)  # rounds of both sides
ALONE = 4  # one client's requests per round and side, the sides alternating
N = 32  # tokens of each answer
CLIENTS = 8
PROMPT = "What is in the picture?"
SETS = {
    "hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 8,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64,
    "rope_scaling": {"type": "mrope", "mrope_section": [8, 12, 12]},
    "vision_config/hidden_size": 256, "vision_config/depth": 8, "vision_config/num_heads": 4,
    "vision_config/intermediate_size": 1024, "vision_config/out_hidden_size": 512,
    "vision_config/fullatt_block_indexes": [3, 7],
    "@preprocessor_config.json/max_pixels": 224 * 224,
}


def vision_model() -> str:
    sets = [f"--set={k}={json.dumps(v)}" for k, v in SETS.items()]
    res = subprocess.run([PY, "-m", "tests.models.vision_zoo", str(CACHE / "vision-mid"),
                          "qwen2_5_vl", *sets], capture_output=True, text=True, check=True,
                         cwd=REPO)
    made: dict[str, dict[str, str]] = json.loads(res.stdout.strip().splitlines()[-1])
    return made["qwen2_5_vl"]["path"]


def pictures(n: int) -> list[str]:
    """Data URLs of n different 224x224 test pictures (made in a subprocess: no numpy here)."""
    code = ("import base64, io, json, sys; from tests.models.vision_zoo import picture\n"
            "out = []\n"
            f"for s in range({n}):\n"
            "    b = io.BytesIO(); picture(224, 224, seed=1000 + s).save(b, 'PNG')\n"
            "    out.append(base64.b64encode(b.getvalue()).decode())\n"
            "sys.stdout.write(json.dumps(out))")
    got: list[str] = json.loads(subprocess.run([PY, "-c", code], cwd=REPO, check=True,
                                               capture_output=True, text=True).stdout)
    return [f"data:image/png;base64,{p}" for p in got]


class Side:
    """One server's OpenAI chat completions, streamed."""

    def __init__(self, name: str, port: int, model: str, pids: list[int]) -> None:
        self.name, self.port, self.model, self.pids = name, port, model, pids

    def cpu(self) -> float:
        """CPU seconds its processes have used so far."""
        return sum(cpu_seconds(pid) for pid in self.pids)

    def ask(self, messages: list[dict[str, Any]]) -> tuple[float, float, int, str]:
        """(time to first token, time to the last, tokens, text) of one streamed answer."""
        body = json.dumps({"model": self.model, "messages": messages, "max_tokens": N,
                           "temperature": 0, "stream": True,
                           "stream_options": {"include_usage": True}})
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        try:
            t0 = time.perf_counter()
            conn.request("POST", "/v1/chat/completions", body,
                         {"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                raise RuntimeError(f"{self.name}: {resp.status} {resp.read()[:500]!r}")
            got = read_chat_stream(resp)
            first, last = got.first, got.last
            assert first is not None and last is not None, f"{self.name}: no text"
            return first - t0, last - t0, got.tokens or got.pieces, got.text
        finally:
            conn.close()


def turn(url: str, question: str = PROMPT) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                        {"type": "text", "text": question}]}


def start_mlx_vlm(path: str) -> tuple[subprocess.Popen[str], Side]:
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    blas = blas_path()
    if blas:
        env["LD_PRELOAD"] = blas
    if os.environ.get("EXOD_BENCH_APC") == "1":
        env["APC_ENABLED"] = "1"
    proc = subprocess.Popen([PY, "-m", "mlx_vlm.server", "--model", path, "--host",
                             "127.0.0.1", "--port", str(port)], env=env, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    threading.Thread(target=lambda: [None for _ in proc.stderr or ()], daemon=True).start()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mlx_vlm.server exited with {proc.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return proc, Side("mlx-vlm", port, path, [proc.pid])
        except OSError:
            time.sleep(0.5)  # polling a server that is still starting
    raise RuntimeError("mlx_vlm.server did not answer within 300 s")


def start_exod(path: str) -> tuple[Daemon, Side]:
    d = Daemon({"ready": "instances", "instances": {
        "eye": {"model": path, "max_concurrency": CLIENTS}}}, name="bench-vision")
    d.start()
    assert d.proc is not None
    runner = d.until_instance("eye", lambda i: i["state"] == "ready")["ranks"][0]["pid"]
    return d, Side("exod", int(d.api_url().rsplit(":", 1)[1]), "eye", [d.proc.pid, runner])


def alone(sides: tuple[Side, Side], urls: dict[str, list[str]]) -> list[dict[str, Any]]:
    """One client's requests, the sides alternating request by request (the leader turned each
    time): per request and side, time to first token and tokens/s from the first to the last."""
    got: list[dict[str, Any]] = []
    for k in range(ALONE):
        pair: dict[str, Any] = {}
        for side in (sides if k % 2 == 0 else sides[::-1]):
            first, last, tokens, _ = side.ask([turn(urls[side.name][k])])
            pair[side.name] = {"ttft": first, "one": tokens / last}
        got.append(pair)
    return got


def measure(side: Side, urls: list[str]) -> dict[str, float]:
    """One round of one side: 8 clients, the second turn and CPU per token."""
    cpu = side.cpu()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(CLIENTS) as pool:
        got = list(pool.map(lambda u: side.ask([turn(u)]), urls[:CLIENTS]))
    many = sum(g[2] for g in got) / (time.perf_counter() - t0)
    first = side.ask([turn(urls[-1])])
    follow = [turn(urls[-1]), {"role": "assistant", "content": first[3]},
              {"role": "user", "content": "And what colour is it?"}]
    second, _, more, _ = side.ask(follow)
    tokens = sum(g[2] for g in got) + first[2] + more
    return {"many": many, "second": second, "cpu": (side.cpu() - cpu) / tokens}


def main() -> None:
    path = vision_model()
    per = ALONE + CLIENTS + 1  # pictures of one side's round
    urls = pictures(ROUNDS * 2 * per + 1)
    proc, theirs = start_mlx_vlm(path)
    d, ours = start_exod(path)
    try:
        warm = urls.pop()
        # Compared without a leading space: mlx-lm's streaming detokenizer drops the answer's.
        answers = [side.ask([turn(warm)])[3] for side in (ours, theirs)]
        same = len({a.removeprefix(" ") for a in answers}) == 1
        rounds: list[dict[str, dict[str, float]]] = []
        pairs: list[dict[str, Any]] = []
        for i in range(ROUNDS):
            order = (ours, theirs) if i % 2 == 0 else (theirs, ours)
            mine: dict[str, list[str]] = {}
            for side in order:
                mine[side.name], urls = urls[:ALONE], urls[ALONE:]
            pairs += alone(order, mine)
            got: dict[str, dict[str, float]] = {}
            for side in order:
                rest, urls = urls[:CLIENTS + 1], urls[CLIENTS + 1:]
                got[side.name] = measure(side, rest)
            rounds.append(got)
    finally:
        d.close()
        proc.terminate()
        proc.wait(30)

    def ratio(name: str, key: str, time_like: bool, of: list[dict[str, Any]]) -> Figure:
        xs = sorted((r["mlx-vlm"][key] / r["exod"][key]) if time_like
                    else (r["exod"][key] / r["mlx-vlm"][key]) for r in of)
        mid = statistics.median(xs)
        if of is pairs:
            q = statistics.quantiles(xs, n=4)
            return Figure(name, mid, low=q[0], high=q[2], goal=">= 1.0x",
                          text=f"range: the middle half of {len(xs)} pairs")
        return Figure(name, mid, rounds=xs, goal=">= 1.0x")

    rows = [ratio("time to first token, 1 client", "ttft", True, pairs),
            ratio("tokens/s, 1 client", "one", False, pairs),
            ratio(f"aggregate tokens/s, {CLIENTS} clients", "many", False, rounds),
            ratio("second turn's time to first token", "second", True, rounds),
            ratio("CPU seconds per token, every process", "cpu", True, rounds)]
    apc = "on" if os.environ.get("EXOD_BENCH_APC") == "1" else "off (as it comes)"
    report(f"vision: exod over mlx_vlm.server, same model and pictures (APC {apc}; goal >= "
           "1.0x)", [
               *rows,
               Figure("same answer to the same picture", None, text=str(same), met=same),
               ("per round (exod, mlx-vlm): many, second, cpu",
                json.dumps([{s: {k: round(v, 3) for k, v in r[s].items()} for s in r}
                            for r in rounds])),
               ("one client's pairs (exod, mlx-vlm): ttft, one",
                json.dumps([{s: {k: round(v, 3) for k, v in p[s].items()} for s in p}
                            for p in pairs]))])


if __name__ == "__main__":
    sys.exit(main())
