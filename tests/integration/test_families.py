"""The zoo: every family of exod.models.zoo (tiny models built from mlx-lm's own classes, made
at test time), plus 4-bit variants, served by a real daemon in 1 rank, a 2-rank pipeline and
2-rank tensor parallelism, with the same greedy text as in-process mlx-lm. A layout that the
probe refuses is refused by the config check before any process starts, and the refusals are
exactly the known ones (zoo.KNOWN_REFUSALS), so a change in either direction shows here.

Families share daemons, a few per daemon (one instance per family and layout), to keep the
suite fast on two cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import openai
import pytest

from exod.config.probe import answers as probe_answers
from exod.models.zoo import FAMILIES, KNOWN_REFUSALS, QUANTIZED, zoo_name
from tests.harness import REPO, Daemon

PROMPT = "def fibonacci(n):\n    return"
MAX_TOKENS = 12
EOS = 2
PER_DAEMON = 4
LAYOUTS: dict[str, dict[str, Any]] = {
    "one": {},
    "pp": {"shards": 2},
    "tp": {"shards": 2, "parallelism": "tensor"},
}
SPECS = [f for f in FAMILIES] + [f"{f}:4" for f in QUANTIZED]


def _name(spec: str) -> str:
    family, _, bits = spec.partition(":")
    return zoo_name(family, int(bits) if bits else None)


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    """name -> {"path", "text" (in-process mlx-lm's greedy output)}; made in a subprocess so
    this process never imports mlx."""
    root = tmp_path_factory.mktemp("zoo")
    proc = subprocess.run(
        [sys.executable, "-m", "exod.models.zoo", str(root), *SPECS, "--prompt", PROMPT,
         "--max-tokens", str(MAX_TOKENS), "--ban", str(EOS)],
        cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True,
        timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    made: dict[str, dict[str, str]] = json.loads(proc.stdout.strip().splitlines()[-1])
    return made


def _refusals(zoo: dict[str, dict[str, str]]) -> dict[tuple[str, str], str]:
    """What the config check refuses, by the same probe (one subprocess for all of them)."""
    asks = [(name, layout, (Path(info["path"]), 2, extra.get("parallelism", "pipeline"), None))
            for name, info in zoo.items() for layout, extra in LAYOUTS.items() if extra]
    got = probe_answers([ask for _, _, ask in asks])
    return {(name, layout): str(a.get("reason"))
            for (name, layout, _), a in zip(asks, got, strict=True)
            if a is not None and not a.get("ok") and not a.get("unknown")}


def _greedy(d: Daemon, model: str) -> str:
    c = openai.OpenAI(base_url=d.api_url() + "/v1", api_key="-", max_retries=0, timeout=120)
    r = c.completions.create(model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0,
                             logit_bias={str(EOS): -100})
    return r.choices[0].text


def test_the_zoo_in_every_layout(zoo: dict[str, dict[str, str]]) -> None:
    refused = _refusals(zoo)
    assert refused.keys() == KNOWN_REFUSALS.keys(), refused
    served: list[tuple[str, str]] = [(n, lay) for n in zoo for lay in LAYOUTS
                                     if (n, lay) not in refused]
    names = sorted(zoo)
    wrong: dict[str, tuple[str, str]] = {}
    for i in range(0, len(names), PER_DAEMON):
        group = [(n, lay) for n, lay in served if n in names[i:i + PER_DAEMON]]
        instances = {f"{n}-{lay}".replace("_", "-"): {"model": zoo[n]["path"], **LAYOUTS[lay]}
                     for n, lay in group}
        d = Daemon({"instances": instances})
        try:
            d.start()
            d.watch_until(lambda s: all(i["state"] in ("ready", "failed")
                                        for i in s["instances"]), what="every instance up")
            for (n, _), inst in zip(group, instances, strict=True):
                state = d.instance(inst)["state"]
                got = _greedy(d, inst) if state == "ready" else f"<{state}>"
                if got != zoo[n]["text"]:
                    wrong[inst] = (zoo[n]["text"], got)
        finally:
            d.close()
    assert not wrong, wrong
