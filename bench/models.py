"""Models by hub name, against the same local hub-compatible server (olah, tests/hub.py):

- download: exod's fetcher (`python -m exod.hub`, resumable files, hashed as they come) vs
  huggingface_hub's own `snapshot_download` of the same files, each in a fresh process into a
  fresh cache, rounds in ABBA order. Goal: exod's throughput ≥ 0.95× huggingface_hub's.
- time to ready of an instance whose model is a cached hub name vs the same files named by a
  local path (`exod run` with `ready: instances` → READY=1). Goal ≤ 1.05×. The local path is a
  plain copy of the snapshot on the same file system, and each side runs once untimed first, so
  both read their files from the page cache; then rounds in ABBA order, the figure being the
  median of the per-round ratios (with their range: on a shared host one round swings
  widely). Beside it the daemon's own part, read from its log: config read → runner spawned,
  where a hub name costs reading exod's manifest and a stat() per file.

- speculative decoding in the continuous batch: an instance with `draft_model` vs the same
  model without, aggregate greedy tok/s of 1, 4 and 8 clients at once (each its own question;
  rounds in ABBA order), with the share of drafted tokens the model accepted (from `exoctl
  status`). Goal at 8 clients: ≥ 1.2x. The pair: the demo model (SmolLM2-135M) drafts 2 tokens
  a step (mlx-lm's speculative_generate_step default) for a deeper copy of itself
  (tests.models.deep: 150 more layers that nudge it, several times the cost a token), as a small
  model drafts for a large one of its family; no hub is reachable here for a trained pair.
  Every answer must be the same text with and without the draft (greedy).
  `python -m bench.models speculative` runs this section alone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai

from bench.common import CACHE, PY, REPO, median, model, report, Row
from bench.results import Figure
from exod.wire import messages as m
from exod.wire.ask import ask
from exod.core.hub_ref import HubRef
from exod.wire.specs import FetchSpec
from tests.harness import Daemon
from tests.hub import Hub

SNAPSHOT = """
import sys
from huggingface_hub import snapshot_download
snapshot_download(sys.argv[1], cache_dir=sys.argv[2], allow_patterns=sys.argv[3:])
"""
FILES = ["*.safetensors", "*.json", "*.jinja", "tokenizer.model", "tiktoken.model",
         "*.tiktoken", "*.txt", "*.jsonl"]


def fetch_exod(env: dict[str, str], cache: Path) -> float:
    """The fetcher as the daemon starts one: its spec on its channel, until it says Fetched."""
    spec = FetchSpec(version=m.VERSION, ref=HubRef("org/bench", "main"), cache=cache,
                     commit=None, offline=False, token_file=None, peers=(),
                     cluster_key_file=None)
    t = time.perf_counter()
    done = ask("exod.hub", spec, {m.Fetched.type: m.Fetched, m.Failed.type: m.Failed}, 3600,
               env, meanwhile=m.FROM_FETCHER)
    assert isinstance(done, m.Fetched), done
    return time.perf_counter() - t


def fetch_hf(env: dict[str, str], cache: Path) -> float:
    t = time.perf_counter()
    subprocess.run([PY, "-c", SNAPSHOT, "org/bench", str(cache), *FILES], env=env, check=True,
                   capture_output=True)
    return time.perf_counter() - t


def ready_time(instance: dict[str, object], env: dict[str, str], hub: dict[str, object]
               ) -> tuple[float, float]:
    """Seconds from `exod run` to READY=1, and the daemon's part: from its config read (the
    log's first line naming the instances) to the runner spawned."""
    d = Daemon({"ready": "instances", "hub": hub, "instances": {"m": instance}}, env=env,
               name="bench")
    try:
        t = time.perf_counter()
        d.start(wait_ready=True)
        elapsed = time.perf_counter() - t
        assert d.instance("m")["state"] == "ready"
        d.terminate()
        at = {}
        for rec in d.events():
            for key, prefix in (("config", "exod "), ("spawned", "started, layers")):
                if key not in at and rec["message"].startswith(prefix):
                    at[key] = rec["time"]["timestamp"]
        return elapsed, at["spawned"] - at["config"]
    finally:
        d.close()


def ready_rounds(cache: Path, env: dict[str, str], rounds: int
                 ) -> tuple[list[float], float, float]:
    """Per-round ratios hub name / local path, and the daemon's part of each side (median)."""
    snap = next((cache / "models--org--bench" / "snapshots").iterdir())
    local = cache.parent / "local-copy"
    shutil.copytree(snap, local, symlinks=False)  # regular files, as a user's folder holds
    sides = {"hub": {"model": "hf:org/bench"}, "path": {"model": str(local)}}
    hub = {"cache": str(cache), "offline": True}
    for inst in sides.values():  # untimed: the same page-cache state for both
        ready_time(inst, env, hub)
    ratios: list[float] = []
    parts: dict[str, list[float]] = {"hub": [], "path": []}
    for i in range(rounds):
        took = {}
        for what in ("hub", "path") if i % 2 == 0 else ("path", "hub"):
            took[what], part = ready_time(sides[what], env, hub)
            parts[what].append(part)
        ratios.append(took["hub"] / took["path"])
    return ratios, median(parts["hub"]), median(parts["path"])


SPEC_QUESTIONS = ["Write a Python function that returns the n-th Fibonacci number, with a "
                  "docstring.", "Explain what a hash map is, in three sentences.",
                  "Write a haiku about the sea.", "List five prime numbers and say why each is "
                  "prime.", "Write a SQL query that counts users by country.",
                  "Describe the water cycle for a child.", "Write a shell loop that prints 1 "
                  "to 10.", "What is the difference between a list and a tuple in Python?"]
SPEC_TOKENS = 48
SPEC_DRAFT_TOKENS = 2
SPEC_CLIENTS = (1, 4, 8)
SPEC_GOAL = 1.2  # at 8 clients


def made(*args: str) -> Path:
    """A model made by a generator module (in a subprocess: the bench never imports mlx)."""
    res = subprocess.run([PY, "-m", *args], capture_output=True, text=True, check=True,
                         cwd=REPO)
    return Path(res.stdout.strip().splitlines()[-1])


def load() -> str:
    return f"load {os.getloadavg()[0]:.1f}"


def speculative(rounds: int) -> list[Row]:
    """Aggregate greedy tok/s of N clients at once (each its own question), draft vs no draft,
    in rounds of ABBA order; every answer must be the same text with and without the draft."""
    draft = made("exod.models.demo", "--cache-dir", str(CACHE))
    deep = made("tests.models.deep", str(draft), str(CACHE / "deep-smollm2"), "--extra", "150",
                "--scale", "0.03")
    # Admission reserves context_tokens a row: the default (4096) for 8 rows of 180 float32
    # layers on each side is more than a small host holds; these chats need far fewer.
    sides = {"max_concurrency": max(SPEC_CLIENTS), "context_tokens": 512}
    d = Daemon({"instances": {
        "plain": {"model": str(deep), **sides},
        "spec": {"model": str(deep), "draft_model": str(draft),
                 "num_draft_tokens": SPEC_DRAFT_TOKENS, **sides},
    }}, name="bench-spec")
    loads = [load()]
    rates: dict[tuple[str, int], list[float]] = {}
    accepted: dict[int, tuple[int, int]] = {}
    texts: dict[tuple[str, str], set[str]] = {}
    try:
        d.start()
        d.watch_until(lambda s: all(i["state"] == "ready" for i in s["instances"]),
                      what="both instances ready")
        client = openai.OpenAI(base_url=d.api_url() + "/v1", api_key="-", max_retries=0,
                               timeout=3600)

        def answer(name: str, question: str) -> tuple[int, str]:
            r = client.chat.completions.create(
                model=name, messages=[{"role": "user", "content": question}],
                max_tokens=SPEC_TOKENS, temperature=0)
            assert r.usage is not None
            return r.usage.completion_tokens, r.choices[0].message.content or ""

        def counts() -> tuple[int, int]:
            spec = (d.instance("spec").get("serving") or {}).get("speculative") or {}
            return int(spec.get("drafted") or 0), int(spec.get("accepted") or 0)

        for clients in SPEC_CLIENTS:
            before = counts()
            for i in range(rounds):
                for name in ("plain", "spec") if i % 2 == 0 else ("spec", "plain"):
                    questions = SPEC_QUESTIONS[:clients]
                    t = time.perf_counter()
                    with ThreadPoolExecutor(clients) as pool:
                        got = list(pool.map(lambda q, n=name: answer(n, q), questions))
                    took = time.perf_counter() - t
                    rates.setdefault((name, clients), []).append(
                        sum(n for n, _ in got) / took)
                    for q, (_, text) in zip(questions, got, strict=True):
                        texts.setdefault((name, q), set()).add(text)
            after = counts()
            accepted[clients] = (after[0] - before[0], after[1] - before[1])
        loads.append(load())
    finally:
        d.close()
    for q in SPEC_QUESTIONS:  # the same greedy text, with and without the draft, every time
        assert texts[("plain", q)] == texts[("spec", q)] and len(texts[("plain", q)]) == 1, q
    rows: list[Row] = [("pair", f"SmolLM2-135M drafts {SPEC_DRAFT_TOKENS} a step for its deep "
                                f"copy (+150 layers); {SPEC_TOKENS} greedy tokens a client, "
                                f"{rounds} rounds ABBA, the same text with and without; "
                                f"{loads[0]} before, {loads[-1]} after")]
    for clients in SPEC_CLIENTS:
        p, s = median(rates[("plain", clients)]), median(rates[("spec", clients)])
        ratios = [b / a for a, b in zip(rates[("plain", clients)], rates[("spec", clients)],
                                        strict=True)]
        drafted, kept = accepted[clients]
        rows += [
            Figure("speculative tok/s", s / p, sides={"draft": s, "no draft": p},
                   side_unit="tok/s", at={"clients": clients}, rounds=ratios,
                   goal=f">= {SPEC_GOAL}x" if clients == max(SPEC_CLIENTS) else None),
            Figure("drafted tokens accepted", 100 * kept / drafted if drafted else None,
                   unit="%", at={"clients": clients}, text=f"{kept} of {drafted}"),
        ]
    return rows


def main(rounds: int = 4) -> None:
    weights = model("hub-230m", layers=8, hidden=512, intermediate=1536, heads=8, kv_heads=4,
                    vocab=32000, shards_files=2)
    size = sum(f.stat().st_size for f in weights.iterdir() if not f.name.startswith("."))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        h = Hub(root / "hub")
        h.publish(weights, "org/bench")
        h.start()
        env = {**os.environ, "HF_ENDPOINT": h.url, "HF_HUB_DISABLE_TELEMETRY": "1"}
        try:
            ours, theirs = [], []
            for i in range(rounds):
                order = (fetch_exod, fetch_hf) if i % 2 == 0 else (fetch_hf, fetch_exod)
                for fn in order:
                    cache = root / f"cache-{fn.__name__}"
                    shutil.rmtree(cache, ignore_errors=True)
                    (ours if fn is fetch_exod else theirs).append(fn(env, cache))
            kept = root / "cache-fetch_exod"  # the last exod fetch: a cached model
            ratios, part_hub, part_path = ready_rounds(kept, env, 2 * rounds)
        finally:
            h.close()
    o, t = median(ours), median(theirs)
    r = median(ratios)
    rows: list[Row] = [
        ("huggingface_hub snapshot_download", f"{t:.2f} s ({size / t / 1e6:.0f} MB/s)"),
        ("exod fetcher (resumable, hashed)", f"{o:.2f} s ({size / o / 1e6:.0f} MB/s)"),
        Figure("throughput exod / huggingface_hub", t / o, goal=">= 0.95x",
               sides={"exod": size / o / 1e6, "huggingface_hub": size / t / 1e6},
               side_unit="MB/s"),
        Figure("exod run → ready, cached hub name / local path", r, goal="<= 1.05x",
               rounds=ratios),
        ("  daemon's part: config read → runner spawned",
         f"hub name {part_hub * 1e3:.1f} ms, local path {part_path * 1e3:.1f} ms"),
    ]
    report(f"models: {size / 1e6:.0f} MB model from a local olah, median of {rounds} rounds",
           rows + speculative(2))


if __name__ == "__main__":
    if sys.argv[1:] == ["speculative"]:  # that section alone
        report("models: speculative decoding in the batch", speculative(2))
    else:
        main()
