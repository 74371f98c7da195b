"""The vision zoo (tests.models.vision_zoo): a tiny model of each vision family users run, made
from mlx-vlm's own classes, that in-process mlx-vlm loads offline (`load`), prompts
(`apply_chat_template` with the number of images) and generates from, greedily, the same
tokens every time; the picture changes them; several pictures and none work.
Made once per run (~2.5 CPU-s); each mlx-vlm pass over the five families is a subprocess
(the test process never imports mlx) of ~4 CPU-s, most of it imports: ~27 CPU-s in all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.harness import REPO
from tests.models.vision_families import FAMILIES
from tests.shared import made_once

PROMPT = "What is in the picture?"
Zoo = dict[str, dict[str, Any]]


def run_zoo(root: Path, *args: str) -> Zoo:
    """`python -m tests.models.vision_zoo ROOT ARGS`: family -> {"path", "tokens"}."""
    proc = subprocess.run(
        [sys.executable, "-m", "tests.models.vision_zoo", str(root), *args], cwd=REPO,
        env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True,
        timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    made: Zoo = json.loads(proc.stdout.strip().splitlines()[-1])
    return made


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory, vision_zoo: Path) -> tuple[Path, Zoo]:
    made: Zoo = made_once(tmp_path_factory, "vision-zoo-tokens",
                          lambda _: run_zoo(vision_zoo, "--prompt", PROMPT))
    return vision_zoo, made


def test_every_family_loads_and_generates_the_same_tokens_each_time(
        zoo: tuple[Path, Zoo]) -> None:
    root, first = zoo
    assert sorted(first) == sorted(FAMILIES)
    assert all(len(info["tokens"]) == 8 for info in first.values()), first
    again = run_zoo(root, "--prompt", PROMPT)  # a new process, the models as made
    assert {f: i["tokens"] for f, i in again.items()} == {f: i["tokens"] for f, i in first.items()}


def test_the_picture_changes_the_tokens_and_several_or_none_work(zoo: tuple[Path, Zoo]) -> None:
    root, first = zoo
    others = [run_zoo(root, "--prompt", PROMPT, "--image-seed", str(s)) for s in (1, 2)]
    two = run_zoo(root, "--prompt", PROMPT, "--images", "2")
    none = run_zoo(root, "--prompt", PROMPT, "--images", "0")
    for family, one in first.items():
        # Random weights see little: over three pictures, at least two answers.
        seen = {tuple(one["tokens"])} | {tuple(o[family]["tokens"]) for o in others}
        assert len(seen) >= 2, (family, seen)
        # Each picture is its placeholders in the prompt, as the family's processor makes them.
        counts = [none[family]["prompt_tokens"], one["prompt_tokens"],
                  two[family]["prompt_tokens"]]
        # (Not exactly as many each: Gemma 3's "\n\n" around two pictures side by side
        # tokenize as one "\n\n\n\n".)
        assert counts[0] < counts[1] < counts[2], (family, counts)
        assert len(two[family]["tokens"]) == len(none[family]["tokens"]) == 8, family


def test_the_models_are_made_byte_for_byte_alike(tmp_path: Path) -> None:
    run_zoo(tmp_path / "a", "qwen2_5_vl", "llava")
    run_zoo(tmp_path / "b", "qwen2_5_vl", "llava")
    for family in ("qwen2_5_vl", "llava"):
        a, b = tmp_path / "a" / family, tmp_path / "b" / family
        names = sorted(p.name for p in a.iterdir())
        assert names == sorted(p.name for p in b.iterdir())
        assert all((a / n).read_bytes() == (b / n).read_bytes() for n in names), family
