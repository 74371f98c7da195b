"""Models by hub name, against the same local hub-compatible server (olah, tests/hub.py):

- download: exod's fetcher (`python -m exod.hub`, resumable files, hashed as they come) vs
  huggingface_hub's own `snapshot_download` of the same files, each in a fresh process into a
  fresh cache, rounds in ABBA order. Goal: exod's throughput ≥ 0.95× huggingface_hub's.
- time to ready of an instance whose model is a cached hub name vs the same files named by a
  local path (`exod run` with `ready: instances` → READY=1). Goal ≤ 1.05×.

- speculative decoding: an instance with `draft_model` vs the same model without, greedy
  tok/s of one chat at a time (rounds in ABBA order), with the share of drafted tokens the
  model accepted (from `exoctl status`). The pair: the demo model (SmolLM2-135M) drafts 2
  tokens a step (mlx-lm's speculative_generate_step default) for a deeper copy of itself
  (tests.models.deep: 150 more layers that nudge it, about 5x the cost a token), as a small
  model drafts for a large one of its family; no hub is reachable here for a trained pair.
  The two answers must be the same text.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import openai

from bench.common import CACHE, PY, REPO, median, model, report, verdict
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
    t = time.perf_counter()
    subprocess.run([PY, "-m", "exod.hub", "--repo", "org/bench", "--cache", str(cache)],
                   env=env, check=True, capture_output=True)
    return time.perf_counter() - t


def fetch_hf(env: dict[str, str], cache: Path) -> float:
    t = time.perf_counter()
    subprocess.run([PY, "-c", SNAPSHOT, "org/bench", str(cache), *FILES], env=env, check=True,
                   capture_output=True)
    return time.perf_counter() - t


def ready_time(instance: dict[str, object], env: dict[str, str], hub: dict[str, object]
               ) -> float:
    d = Daemon({"ready": "instances", "hub": hub, "instances": {"m": instance}}, env=env,
               name="bench")
    try:
        t = time.perf_counter()
        d.start(wait_ready=True)
        elapsed = time.perf_counter() - t
        assert d.instance("m")["state"] == "ready"
        d.terminate()
        return elapsed
    finally:
        d.close()


SPEC_PROMPT = [{"role": "user", "content": "Write a Python function that returns the n-th "
                                           "Fibonacci number, with a docstring."}]
SPEC_TOKENS = 48
SPEC_DRAFT_TOKENS = 2


def made(*args: str) -> Path:
    """A model made by a generator module (in a subprocess: the bench never imports mlx)."""
    res = subprocess.run([PY, "-m", *args], capture_output=True, text=True, check=True,
                         cwd=REPO)
    return Path(res.stdout.strip().splitlines()[-1])


def speculative(rounds: int) -> list[tuple[str, str]]:
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
        serving = (d.instance("spec").get("serving") or {}).get("batching", "")
    finally:
        d.close()
    assert texts["plain"] == texts["spec"] and len(texts["plain"]) == 1, texts
    accepted = re.search(r"(\d+) of (\d+) drafted tokens accepted \((\d+)%\)", serving)
    p, s = median(rates["plain"]), median(rates["spec"])
    return [
        ("plain decoding (deep copy of SmolLM2)", f"{p:.2f} tok/s"),
        (f"speculative, SmolLM2 drafts {SPEC_DRAFT_TOKENS} a step", f"{s:.2f} tok/s (same text)"),
        ("  ratio speculative / plain", f"{s / p:.2f}x"),
        ("  drafted tokens accepted", f"{accepted[3]}% ({accepted[1]} of {accepted[2]})"
                                      if accepted else f"? ({serving!r})"),
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
            by_name, by_path = [], []
            for i in range(rounds):
                pair = [("hub", {"model": "hf:org/bench"}), ("path", {"model": str(weights)})]
                for what, inst in pair if i % 2 == 0 else reversed(pair):
                    t = ready_time(inst, env, {"cache": str(kept), "offline": True})
                    (by_name if what == "hub" else by_path).append(t)
        finally:
            h.close()
    o, t = median(ours), median(theirs)
    n, p = median(by_name), median(by_path)
    report(f"models: {size / 1e6:.0f} MB model from a local olah, median of {rounds} rounds", [
        ("huggingface_hub snapshot_download", f"{t:.2f} s ({size / t / 1e6:.0f} MB/s)"),
        ("exod fetcher (resumable, hashed)", f"{o:.2f} s ({size / o / 1e6:.0f} MB/s)"),
        ("  throughput exod / huggingface_hub", f"{t / o:.3f}x  (goal ≥ 0.95x) "
                                                f"{verdict(t / o >= 0.95)}"),
        ("exod run → ready, model by local path", f"{p:.2f} s"),
        ("exod run → ready, cached hub name", f"{n:.2f} s"),
        ("  ratio hub name / local path", f"{n / p:.3f}x  (goal ≤ 1.05x) "
                                          f"{verdict(n / p <= 1.05)}"),
    ] + speculative(2))


if __name__ == "__main__":
    main()
