"""The grammar engine's slices change how fast a mask is computed, never what it is
(slices_checks.py, in a pytest process of its own: it imports mlx; see tests/own_process.py).
One test here per check function there, failing with that check's report."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.own_process import check_names, failures, run_checks

CHECKS = Path(__file__).with_name("slices_checks.py")
NAMES = check_names(CHECKS)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory, demo_model: Path) -> dict[str, list[str]]:
    return run_checks(CHECKS, tmp_path_factory.mktemp("slices"),
                      env={"EXOD_TEST_DEMO": str(demo_model), "HF_HUB_OFFLINE": "1"})


def test_every_check_was_collected(outcomes: dict[str, list[str]]) -> None:
    assert NAMES and sorted(outcomes) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_slices(outcomes: dict[str, list[str]], name: str) -> None:
    failed = failures(outcomes, name)
    assert not failed, failed
