"""The batch engine on the tiny and demo models, checked in a pytest process of its own
(engine_checks.py; see tests/own_process.py): batching, the prompt cache and its byte cap, a
cancel during prefill. One test here per check function there, failing with that check's
report. Through a daemon and the API: test_serving_engine.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.own_process import check_names, failures, run_checks

CHECKS = Path(__file__).with_name("engine_checks.py")
NAMES = check_names(CHECKS)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path,
             demo_model: Path) -> dict[str, list[str]]:
    return run_checks(CHECKS, tmp_path_factory.mktemp("engine"),
                      env={"EXOD_TEST_TINY": str(tiny_model), "EXOD_TEST_DEMO": str(demo_model),
                           "HF_HUB_OFFLINE": "1"})


def test_every_check_was_collected(outcomes: dict[str, list[str]]) -> None:
    assert len(NAMES) >= 4
    assert sorted(outcomes) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_engine(outcomes: dict[str, list[str]], name: str) -> None:
    failed = failures(outcomes, name)
    assert not failed, failed
