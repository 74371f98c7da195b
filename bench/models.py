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

- speculative decoding: an instance with `draft_model` vs the same model without, greedy
  tok/s of one chat at a time (rounds in ABBA order), with the share of drafted tokens the
  model accepted (from `exoctl status`). The pair: the demo model (SmolLM2-135M) drafts 2
  tokens a step (mlx-lm's speculative_generate_step default) for a deeper copy of itself
  (tests.models.deep: 150 more layers that nudge it, several times the cost a token), as a small
  model drafts for a large one of its family; no hub is reachable here for a trained pair.
  The two answers must be the same text.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
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
                     commit=None, offline=False, token_file=None)
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


SPEC_PROMPT = [{"role": "user", "content": "Write a Python function that returns the n-th "
                                           "Fibonacci number, with a docstring."}]
SPEC_TOKENS = 48
SPEC_DRAFT_TOKENS = 2


def made(*args: str) -> Path:
    """A model made by a generator module (in a subprocess: the bench never imports mlx)."""
    res = subprocess.run([PY, "-m", *args], capture_output=True, text=True, check=True,
                         cwd=REPO)
    return Path(res.stdout.strip().splitlines()[-1])


def speculative(rounds: int) -> list[Row]:
    draft = made("exod.models.demo", "--cache-dir", str(CACHE))
    deep = made("tests.models.deep", str(draft), str(CACHE / "deep-smollm2"), "--extra", "150",
                "--scale", "0.03")
    d = Daemon({"instances": {
        "plain": {"model": str(deep), "max_concurrency": 1},
        "spec": {"model": str(deep), "draft_model": str(draft),
                 "num_draft_tokens": SPEC_DRAFT_TOKENS},
    }}, name="bench-spec")
    try:
        d.start()
        d.watch_until(lambda s: all(i["state"] == "ready" for i in s["instances"]),
                      what="both instances ready")
        client = openai.OpenAI(base_url=d.api_url() + "/v1", api_key="-", max_retries=0,
                               timeout=1200)

        def rate(name: str) -> tuple[float, str]:
            t = time.perf_counter()
            r = client.chat.completions.create(model=name, messages=SPEC_PROMPT,  # type: ignore[arg-type]
                                               max_tokens=SPEC_TOKENS, temperature=0)
            assert r.usage is not None
            return r.usage.completion_tokens / (time.perf_counter() - t), \
                r.choices[0].message.content or ""

        rates: dict[str, list[float]] = {"plain": [], "spec": []}
        texts: dict[str, set[str]] = {"plain": set(), "spec": set()}
        for i in range(rounds):
            for name in ("plain", "spec") if i % 2 == 0 else ("spec", "plain"):
                tok_s, text = rate(name)
                rates[name].append(tok_s)
                texts[name].add(text)
        spec = (d.instance("spec").get("serving") or {}).get("speculative") or {}
    finally:
        d.close()
    assert texts["plain"] == texts["spec"] and len(texts["plain"]) == 1, texts
    p, s = median(rates["plain"]), median(rates["spec"])
    return [
        ("plain decoding (deep copy of SmolLM2)", f"{p:.2f} tok/s"),
        (f"speculative, SmolLM2 drafts {SPEC_DRAFT_TOKENS} a step", f"{s:.2f} tok/s (same text)"),
        Figure("speculative tok/s", s / p, sides={"draft": s, "no draft": p}, side_unit="tok/s",
               at={"clients": 1}),
        ("  drafted tokens accepted", f"{spec['acceptance_rate']:.0%} ({spec['accepted']} of "
                                      f"{spec['drafted']})" if spec.get("drafted") else
                                      f"? ({spec!r})"),
    ]


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
    main()
