"""Fair shares of the batch in the batch engine, checked in a pytest process of its own
(fair_checks.py; see tests/own_process.py): whom a full batch starts next, `batch` work held
back for interactive work and brought back with each request's solo tokens (against in-process
mlx-lm), decoding or in its prompt, on the tiny model and on zoo families whose caches cannot be
rewound; first come first served beside it. One test here per check function there, failing with
that check's report. Through a daemon, in one rank and a group: test_fair.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.test_families import make
from tests.own_process import check_names, failures, run_checks
from tests.shared import made_once

CHECKS = Path(__file__).with_name("fair_checks.py")
NAMES = check_names(CHECKS)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> dict[str, list[str]]:
    zoo = made_once(tmp_path_factory, "zoo", make)
    return run_checks(CHECKS, tmp_path_factory.mktemp("fair"), timeout=1200,
                      env={"EXOD_TEST_TINY": str(tiny_model), "HF_HUB_OFFLINE": "1",
                           "EXOD_TEST_ZOO_JSON": json.dumps(zoo)})


def test_every_check_was_collected(outcomes: dict[str, list[str]]) -> None:
    assert len(NAMES) >= 6
    assert sorted(outcomes) == NAMES
    assert len(outcomes["test_families_whose_caches_cannot_be_rewound_keep_their_tokens_held_back"]
               ) >= 5


@pytest.mark.parametrize("name", NAMES)
def test_fair_engine(outcomes: dict[str, list[str]], name: str) -> None:
    failed = failures(outcomes, name)
    assert not failed, failed
