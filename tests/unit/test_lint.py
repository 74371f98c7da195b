"""ruff and mypy stay clean (the rules live in pyproject.toml), so CI fails on the first new
warning instead of letting them pile up. Same commands as `make lint`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    # From the repo root, so both tools read pyproject.toml; mypy's cache makes reruns fast.
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=600, check=False)


def test_ruff_is_clean() -> None:
    res = run("ruff", "check", "--no-fix", "exod", "tests", "bench")
    assert res.returncode == 0, f"ruff check failed:\n{res.stdout}{res.stderr}"


def test_mypy_is_clean() -> None:
    res = run("mypy", "exod", "tests/models")  # the model generators moved out of exod/
    assert res.returncode == 0, f"mypy failed:\n{res.stdout}{res.stderr}"
