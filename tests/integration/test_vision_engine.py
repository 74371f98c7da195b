"""The vision engine on the vision zoo, checked in a pytest process of its own
(vision_checks.py; see tests/own_process.py): tokens equal to in-process mlx-vlm's, alone and in
a batch mixing pictures and text, in every family; the caches on a second turn; seeds under
batching; a forced tool call and a JSON schema with pictures; hostile pictures; cancels and a
stop's first rung. One test here per check function there, failing with that check's report.
~22 CPU-s. Through the real runner process: test_vision_runner.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.own_process import check_names, failures, run_checks

CHECKS = Path(__file__).with_name("vision_checks.py")
NAMES = check_names(CHECKS)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory, vision_zoo: Path) -> dict[str, list[str]]:
    return run_checks(CHECKS, tmp_path_factory.mktemp("vision"),
                      env={"EXOD_TEST_VISION_ZOO": str(vision_zoo), "HF_HUB_OFFLINE": "1"})


def test_every_check_was_collected(outcomes: dict[str, list[str]]) -> None:
    assert len(NAMES) >= 6
    assert sorted(outcomes) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_vision_engine(outcomes: dict[str, list[str]], name: str) -> None:
    failed = failures(outcomes, name)
    assert not failed, failed
