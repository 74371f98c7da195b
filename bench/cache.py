"""The prompt cache kept on disk (issue 29): what a restart costs an agent's next request.

One run, side by side, on a ~3.5k-token agent-like prompt (a system prompt with tool
definitions, then a short question), greedy, the demo model, OpenBLAS on every side:

- exod, time to first token after a restart (its prompt loaded from the disk tier) against
  the same prompt cold (prefilled): goal ≤ 0.2x;
- the same against mlx_lm.server after its restart (it keeps no disk tier: a full prefill),
  and against a RAM hit in exod (the prompt cache before the restart);
- the stop's added time at rung 1: how long the daemon takes to stop (SIGTERM to exit) right
  after the request, with the disk tier against without it (a daemon with
  prompt_cache_disk_bytes: 0 serving the same prompts);
- disk bytes per cached token, against the KV cache's own size per token.

Each of `ROUNDS` rounds (EXOD_BENCH_ROUNDS, default 2) asks a prompt of its own (no round finds
another's), on every side back to back; each figure is the median of its per-round ratios, with
their range: what the rest of the machine does falls on all sides of a round alike.

`EXOD_BENCH_MODEL=DIR` benchmarks another model directory (default: the demo model).
"""

from __future__ import annotations

import base64
import json
import os
import signal
import statistics
import time
from pathlib import Path
from typing import Any

from bench.api import Http, blas_path, demo_model, start_mlx_lm_server
from bench.common import report, Row
from bench.results import Figure
from exod.paths import daemon_id
from tests.harness import Daemon

ROUNDS = int(os.environ.get("EXOD_BENCH_ROUNDS", "2"))
MAX_TOKENS = 4
GOAL = 0.2  # TTFT after a restart, against cold
PREFILL_LIMIT = 3600.0  # seconds a cold prefill may take on a busy machine (a bound, no more)


def agent_system(tag: str, tools: int = 10) -> str:
    """An agent's system prompt: instructions, then the tools as JSON, ~3.5k tokens."""
    specs = [{"type": "function", "function": {
        "name": f"tool_{i}_{tag}",
        "description": f"Tool {i}: reads or writes part {i} of the workspace and returns what "
                       "changed, with line numbers, so the agent can check its edit.",
        "parameters": {"type": "object", "required": ["path", "mode"], "properties": {
            "path": {"type": "string", "description": "a file path, relative to the root"},
            "mode": {"type": "string", "enum": ["read", "write", "append", "diff"]},
            "limit": {"type": "integer", "description": "lines at most"}}}}}
        for i in range(tools)]
    rules = "\n".join(f"{i}. Check the result of each call before the next one; say what you "
                      f"changed in one line, and never guess a path (rule {i}, {tag})."
                      for i in range(40))
    return (f"You are a coding agent ({tag}). Follow these rules:\n{rules}\n\n"
            f"Tools:\n{json.dumps(specs, indent=1)}")


def start_exod(path: Path, name: str, disk: bool) -> tuple[Daemon, Http]:
    extra = {} if disk else {"prompt_cache_disk_bytes": 0}
    d = Daemon({"ready": "instances", "instances": {"demo": {"model": str(path), **extra}}},
               name=name)
    d.start()
    return d, http_of(d)


def http_of(d: Daemon) -> Http:
    return Http(int(d.api_url().rsplit(":", 1)[1]), "demo", timeout=PREFILL_LIMIT)


def stopped_in(d: Daemon) -> float:
    """Seconds from SIGTERM to the daemon's exit (its runner's rung 1 included)."""
    t = time.perf_counter()
    assert d.terminate(signal.SIGTERM) == 0
    return time.perf_counter() - t


def one_round(i: int, path: Path, sides: dict[str, Any]) -> dict[str, float]:
    system, ask = agent_system(f"round {i}"), "List the files you would read first."
    exod, plain = sides["exod"], sides["plain"]
    out = {"cold": exod[1].run(ask, MAX_TOKENS, system)[0]}
    plain[1].run(ask, MAX_TOKENS, system)  # the same work, for the stop below
    out["ram"] = exod[1].run(ask, MAX_TOKENS, system)[0]
    out["stop_disk"], out["stop_plain"] = stopped_in(exod[0]), stopped_in(plain[0])
    for d in (exod[0], plain[0]):
        d.start()
    sides["exod"], sides["plain"] = (exod[0], http_of(exod[0])), (plain[0], http_of(plain[0]))
    out["disk"] = sides["exod"][1].run(ask, MAX_TOKENS, system)[0]
    served = sides["exod"][0].instance("demo")["serving"]["prompt_cache"]["disk"]
    out["disk_hits"], out["entries"] = served["hits"], served["entries"]
    server, srv = start_mlx_lm_server(path)  # a fresh start each round: its restart
    srv.timeout = PREFILL_LIMIT
    try:
        out["server"] = srv.run(ask, MAX_TOKENS, system)[0]
    finally:
        server.terminate()
        server.wait(60)
    return out


def disk_per_token(d: Daemon, path: Path) -> tuple[float, float]:
    """(bytes per cached token of the disk tier's files, the KV cache's own bytes per token)."""
    cfg = json.loads((path / "config.json").read_text())
    heads = cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    kv = cfg["num_hidden_layers"] * 2 * heads * head_dim * 4  # float32 on a CPU
    mine = d.dir / "cache" / "prompt-cache" / daemon_id(d.config_path) / "demo"
    files = list(mine.glob("rank0/*/*.safetensors"))
    tokens = 0
    for f in files:
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            meta = json.loads(fh.read(n))["__metadata__"]
        tokens += len(base64.b64decode(meta["0.exod_tokens"])) // 4
    return sum(f.stat().st_size for f in files) / max(1, tokens), float(kv)


def ratio(rounds: list[dict[str, float]], a: str, b: str) -> tuple[float, float, float]:
    xs = [r[a] / r[b] for r in rounds]
    return statistics.median(xs), min(xs), max(xs)


def main() -> None:
    path = Path(os.environ["EXOD_BENCH_MODEL"]) if os.environ.get("EXOD_BENCH_MODEL") \
        else demo_model()
    sides = {"exod": start_exod(path, "bench-cache", disk=True),
             "plain": start_exod(path, "bench-nodisk", disk=False)}
    rounds: list[dict[str, float]] = []
    try:
        for _, h in sides.values():
            h.run("warm up", 4)
        for i in range(ROUNDS):
            rounds.append(one_round(i, path, sides))
        per_token, kv = disk_per_token(sides["exod"][0], path)
    finally:
        for d, _ in sides.values():
            d.close()
    rows: list[Row] = []
    for r in rounds:
        rows.append(("round (s)", "  ".join(f"{k} {v:.2f}" for k, v in r.items())))
    m, lo, hi = ratio(rounds, "disk", "cold")
    rows.append(Figure("TTFT after a restart (disk) / cold", m, low=lo, high=hi,
                       goal=f"<= {GOAL}x"))
    for other, label in (("server", "mlx_lm.server after its restart"), ("ram", "a RAM hit")):
        m, lo, hi = ratio(rounds, "disk", other)
        rows.append(Figure(f"TTFT after a restart (disk) / {label}", m, low=lo, high=hi))
    m, lo, hi = ratio(rounds, "stop_disk", "stop_plain")
    added = statistics.median(r["stop_disk"] - r["stop_plain"] for r in rounds)
    rows.append(Figure("stop with the disk tier / without (SIGTERM to exit)", m, low=lo,
                       high=hi, text=f"added {added * 1e3:+.0f} ms (median)"))
    rows.append(Figure("disk bytes per cached token / the KV cache's own", per_token / kv,
                       text=f"{per_token / 1024:.1f} KiB against {kv / 1024:.1f}"))
    hits = all(r["disk_hits"] >= 1 for r in rounds)
    rows.append(Figure("every round's restart loaded its prompt from disk", None, met=hits,
                       text=str(hits)))
    report(f"prompt cache on disk, {path.name}: {ROUNDS} rounds, ~3.5k-token agent prompt, "
           f"greedy, OpenBLAS {'on' if blas_path() else 'NOT FOUND'} on every side", rows)
