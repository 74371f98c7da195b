"""exod.runner.cpu.split, checked in a pytest process of its own (split_checks.py; see
tests/own_process.py): the checks import mlx. One test here per check function there, failing
with that check's report."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.own_process import check_names, failures, run_checks

CHECKS = Path(__file__).with_name("split_checks.py")
NAMES = check_names(CHECKS)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    return run_checks(CHECKS, tmp_path_factory.mktemp("split"))


def test_every_check_was_collected(outcomes: dict[str, list[str]]) -> None:
    assert len(NAMES) >= 5
    assert sorted(outcomes) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_split(outcomes: dict[str, list[str]], name: str) -> None:
    failed = failures(outcomes, name)
    assert not failed, failed
