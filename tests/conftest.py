"""Shared fixtures. Models are made in subprocesses so the pytest process never imports mlx."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def _run_model_cli(args: list[str], timeout: float) -> Path:
    """Run a model CLI (`python -m tests.models.tiny`, `exod.models.demo`): its last stdout line
    is the model directory."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", *args], check=False, cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
    return Path(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """make(layers=4, **kw) -> directory of a tiny model; kw are make_tiny_model's parameters."""
    root = tmp_path_factory.mktemp("tiny-models")
    made: dict[tuple[tuple[str, object], ...], Path] = {}

    def make(layers: int = 4, **kw: object) -> Path:
        key = tuple(sorted({"layers": layers, **kw}.items()))
        if key not in made:
            options = [f"--{k.replace('_', '-')}={v}" for k, v in key]
            name = "-".join(f"{k}{v}" for k, v in key)
            made[key] = _run_model_cli(["tests.models.tiny", str(root / name), *options], 300)
        return made[key]

    return make


@pytest.fixture(scope="session")
def tiny_model(tiny_model_factory: Callable[..., Path]) -> Path:
    return tiny_model_factory()


@pytest.fixture(scope="session")
def demo_model() -> Path:
    """The demo model, converted once into a cache that outlives the session."""
    cache = os.environ.get("EXOD_TEST_CACHE") or str(Path.home() / ".cache" / "exod-test")
    return _run_model_cli(["exod.models.demo", "--cache-dir", cache], 900)
