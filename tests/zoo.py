"""Serving the zoo (tests.models.zoo) through real daemons and comparing with in-process mlx-lm:
shared by the zoo test (a representative set) and `python -m bench families` (every family,
which writes the supported-models table of docs/models.md). The calling process never imports
mlx."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import openai

from exod.facts.probe import answers as probe_answers
from tests.models.zoo import zoo_name
from tests.harness import REPO, SAFETY, Daemon

PROMPT = "def fibonacci(n):\n    return"
# Greedy tokens compared with mlx-lm's: a split that is wrong differs at the first ones (a random
# model's logits are far apart), and the prompt alone already crosses the zoo's 8-position
# sliding windows. Each token is a step of every rank of every group (a tensor group's all_sums
# poll a core while they wait): 12 -> 6 took a chunk of the zoo from 10.3 to 8.1 CPU-s.
MAX_TOKENS = 6
EOS = 2
LAYOUTS: dict[str, dict[str, Any]] = {
    "one": {},
    "pp": {"shards": 2},
    "tp": {"shards": 2, "parallelism": "tensor"},
}
OK = "ok"


def spec_name(spec: str) -> str:
    family, _, bits = spec.partition(":")
    return zoo_name(family, int(bits) if bits else None)


def make_zoo(root: Path, specs: list[str]) -> dict[str, dict[str, str]]:
    """name -> {"path", "text": in-process mlx-lm's greedy output}, made in a subprocess."""
    proc = subprocess.run(
        [sys.executable, "-m", "tests.models.zoo", str(root), *specs, "--prompt", PROMPT,
         "--max-tokens", str(MAX_TOKENS), "--ban", str(EOS)],
        cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True,
        timeout=900, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"making the zoo failed:\n{proc.stderr[-3000:]}")
    made: dict[str, dict[str, str]] = json.loads(proc.stdout.strip().splitlines()[-1])
    return made


def refusals(zoo: dict[str, dict[str, str]]) -> dict[tuple[str, str], str]:
    """What the config check refuses, by the same probe (one subprocess for all of them)."""
    asks = [(name, layout, (Path(info["path"]), 2, extra.get("parallelism", "pipeline"), None))
            for name, info in zoo.items() for layout, extra in LAYOUTS.items() if extra]
    got = probe_answers([ask for _, _, ask in asks])
    return {(name, layout): str(a.reason)
            for (name, layout, _), a in zip(asks, got, strict=True)
            if a is not None and not a.ok and not a.unknown}


def greedy(d: Daemon, model: str) -> str:
    c = openai.OpenAI(base_url=d.api_url() + "/v1", api_key="-", max_retries=0, timeout=120)
    r = c.completions.create(model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0,
                             logit_bias={str(EOS): -100})
    return r.choices[0].text


def serve_zoo(zoo: dict[str, dict[str, str]], skip: set[tuple[str, str]],
              per_daemon: int = 4, layouts: tuple[str, ...] = tuple(LAYOUTS)
              ) -> dict[tuple[str, str], str]:
    """(name, layout) -> OK, or what went wrong, for each of `layouts`; `per_daemon` families
    share one daemon (one instance per family and layout)."""
    names = sorted(zoo)
    out: dict[tuple[str, str], str] = {}
    for i in range(0, len(names), per_daemon):
        group = [(n, lay) for n in names[i:i + per_daemon] for lay in layouts
                 if (n, lay) not in skip]
        if not group:
            continue
        instances = {f"{n}-{lay}": {"model": zoo[n]["path"], **LAYOUTS[lay]} for n, lay in group}
        d = Daemon({"instances": instances}, name=f"zoo-{i}")
        try:
            d.start()
            try:
                d.watch_until(lambda s: all(x["state"] in ("ready", "failed")
                                            for x in s["instances"]), what="every instance up",
                              timeout=SAFETY * (1 + len(group) // 8))  # they load at once
            except AssertionError:
                pass  # the ones still loading say where they stand, below
            for (n, lay), inst in zip(group, instances, strict=True):
                info = d.instance(inst)
                if info["state"] not in ("ready", "failed"):
                    out[n, lay] = f"not up in time: {info['state']}, {info.get('detail')}"
                    continue
                if info["state"] != "ready":
                    errors = [r.get("error") for r in info.get("ranks", []) if r.get("error")]
                    why = info.get("reason") or "; ".join(errors) or " / ".join(
                        line for line in d.log_text().splitlines() if inst in line)[-600:]
                    out[n, lay] = f"{info['state']}: {why}"
                    continue
                try:
                    got = greedy(d, inst)
                except openai.APIError as e:
                    out[n, lay] = f"the request failed: {e}"
                    continue
                out[n, lay] = OK if got == zoo[n]["text"] else \
                    f"different text: {got!r}, mlx-lm: {zoo[n]['text']!r}"
        finally:
            d.close()
    return out
