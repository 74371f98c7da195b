"""A model that sees, split across a 2-rank pipeline group (exod.runner.vision.group): the vision
tower on rank 0, the language model's layers split, every rank's engine in step. For each of
the zoo's families that split (all but Qwen3-VL, whose tower feeds the language model's first
layers too: refused up front, checked here), two pictures and a question get in-process
mlx-vlm's greedy tokens (as one rank does: test_vision_engine.py), while a text request runs
beside them; for Qwen2.5-VL (M-RoPE: rank 0 sends the other ranks its positions) the same
request again starts from the prompt cache on every rank. Real runners, the ring backend on
loopback, the openai client.

The groups are on demand and stop once idle, so two runners live at a time. ~50 CPU-s: ten
runners' imports and loads, one mlx-vlm reference process for the five families.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.harness import EXOD, REPO, Daemon
from tests.integration.test_vision_runner import PROMPT
from tests.models.vision_families import FAMILIES

PICTURES = 2
N = 8
SPLIT = sorted(f for f in FAMILIES if f != "qwen3_vl")  # deepstack: refused split


def references(zoo: Path) -> dict[str, dict[str, Any]]:
    """mlx-vlm's greedy answer to pictures 0 and 1 then PROMPT, per family (a subprocess:
    this process never imports mlx)."""
    proc = subprocess.run(
        [sys.executable, "-m", "tests.models.vision_zoo", str(zoo), *SPLIT, "--prompt", PROMPT,
         "--images", str(PICTURES), "--max-tokens", str(N)],
        cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True,
        timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got: dict[str, dict[str, Any]] = json.loads(proc.stdout.strip().splitlines()[-1])
    return got


def pictures_png() -> list[str]:
    code = ("import base64, io, json, sys; from tests.models.vision_zoo import picture\n"
            "out = []\n"
            f"for s in range({PICTURES}):\n"
            "    b = io.BytesIO(); picture(seed=s).save(b, 'PNG')\n"
            "    out.append(base64.b64encode(b.getvalue()).decode())\n"
            "sys.stdout.write(json.dumps(out))")
    out: list[str] = json.loads(subprocess.run([sys.executable, "-c", code], cwd=REPO,
                                               capture_output=True, text=True, check=True,
                                               timeout=120).stdout)
    return out


def shown(text: str) -> str:
    """A reference's text as exod shows the same tokens: mlx-lm's streaming detokenizer (as its
    server) drops the answer's leading space."""
    return text[1:] if text.startswith(" ") else text


class Groups:
    def __init__(self, d: Daemon, want: dict[str, dict[str, Any]], pngs: list[str]) -> None:
        self.d, self.want, self.pngs = d, want, pngs
        self.client = openai.OpenAI(base_url=d.api_url() + "/v1", api_key="-", max_retries=0,
                                    timeout=300)

    def ask(self, family: str) -> Any:
        parts: list[Any] = [{"type": "image_url", "image_url": {"url": f"data:image/png;"
                                                                       f"base64,{p}"}}
                            for p in self.pngs]
        return self.client.chat.completions.create(
            model=family, max_tokens=N, temperature=0,
            messages=[{"role": "user", "content": [*parts, {"type": "text", "text": PROMPT}]}])


@pytest.fixture(scope="module")
def groups(vision_zoo: Path) -> Iterator[Groups]:
    want = references(vision_zoo)
    d = Daemon({"api": {"listen": "127.0.0.1:0"}, "instances": {
        family: {"model": str(vision_zoo / family), "shards": 2, "parallelism": "pipeline",
                 "max_concurrency": 4, "autostart": "on-demand", "idle_stop_after": "1s",
                 "backoff": {"initial": "100ms", "jitter": 0}}
        for family in SPLIT}})
    try:
        d.start()
        yield Groups(d, want, pictures_png())
    finally:
        d.close()


@pytest.mark.parametrize("family", SPLIT)
def test_a_two_rank_pipeline_sees_as_mlx_vlm_does_beside_a_text_request(
        groups: Groups, family: str) -> None:
    texts: list[Any] = []

    def text() -> None:
        texts.append(groups.client.chat.completions.create(
            model=family, max_tokens=N, temperature=0,
            messages=[{"role": "user", "content": PROMPT}]))

    r = groups.ask(family)  # starts the group, on demand
    beside = threading.Thread(target=text)
    beside.start()
    again = groups.ask(family)
    beside.join(300)
    want = groups.want[family]
    for answer in (r, again):
        assert answer.choices[0].message.content == shown(want["text"]), family
        assert answer.usage is not None and answer.usage.prompt_tokens == want["prompt_tokens"]
    assert texts and texts[0].usage.completion_tokens == N
    serving = groups.d.instance(family)["serving"]
    assert serving is not None and serving["batching"] == "continuous", serving
    if family == "qwen2_5_vl":  # the second time from the cache, on both ranks
        assert again.usage is not None and again.usage.prompt_tokens_details is not None
        assert again.usage.prompt_tokens_details.cached_tokens == want["prompt_tokens"] - 1


def test_a_family_whose_tower_feeds_the_first_layers_is_refused_up_front(
        vision_zoo: Path, tmp_path: Path) -> None:
    config = tmp_path / "exod.yaml"
    config.write_text(f"instances:\n  q:\n    model: {vision_zoo / 'qwen3_vl'}\n"
                      "    shards: 2\n")
    proc = subprocess.run([*EXOD, "check", "-c", str(config)], cwd=REPO, capture_output=True,
                          text=True, timeout=300, check=False,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 78, proc.stdout + proc.stderr
    assert "deepstack" in proc.stdout + proc.stderr
