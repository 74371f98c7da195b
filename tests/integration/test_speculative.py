"""Speculative decoding in the batch engine, on the tiny model drafting for a deeper copy of it,
checked in a pytest process of its own (speculative_checks.py; see tests/own_process.py): four
requests in one batch get the model's own greedy tokens, a grammar row stays valid beside them,
a second turn hits the prompt cache, rows that end or leave early touch nothing else."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import REPO
from tests.own_process import check_names, failures, run_checks

CHECKS = Path(__file__).with_name("speculative_checks.py")
NAMES = check_names(CHECKS)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> dict[str, list[str]]:
    tmp = tmp_path_factory.mktemp("speculative")
    # 4 more layers that nudge it: its greedy tokens are mostly, not always, the tiny's. (The
    # same pair built on the demo model took minutes of the suite, for the same checks.)
    made = subprocess.run([sys.executable, "-m", "tests.models.deep", str(tiny_model),
                           str(tmp / "deep"), "--extra", "4", "--scale", "0.1"], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=True)
    deep = made.stdout.strip().splitlines()[-1]
    return run_checks(CHECKS, tmp, env={"EXOD_TEST_DEMO": str(tiny_model),
                                        "EXOD_TEST_DEEP": deep, "HF_HUB_OFFLINE": "1"})


def test_every_check_was_collected(outcomes: dict[str, list[str]]) -> None:
    assert len(NAMES) >= 5
    assert sorted(outcomes) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_speculative(outcomes: dict[str, list[str]], name: str) -> None:
    failed = failures(outcomes, name)
    assert not failed, failed
