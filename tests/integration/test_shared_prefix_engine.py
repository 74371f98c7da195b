"""Shared prefixes prefilled once in the batch engine, checked in a pytest process of its own
(shared_prefix_checks.py; see tests/own_process.py): a burst's tokens against in-process
mlx-lm alone, the prefix through the model once, on the tiny model and on every zoo family, a
leader cancelled, a follower joining half way, a prefix on disk read once. One test here per
check function there, failing with that check's report. Through a daemon, in a group's
layouts: test_shared_prefix.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.test_families import make
from tests.own_process import check_names, failures, run_checks
from tests.shared import made_once

CHECKS = Path(__file__).with_name("shared_prefix_checks.py")
NAMES = check_names(CHECKS)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> dict[str, list[str]]:
    zoo = made_once(tmp_path_factory, "zoo", make)
    return run_checks(CHECKS, tmp_path_factory.mktemp("shared-prefix"), timeout=1800,
                      env={"EXOD_TEST_TINY": str(tiny_model), "HF_HUB_OFFLINE": "1",
                           "EXOD_TEST_ZOO_JSON": json.dumps(zoo)})


def test_every_check_was_collected(outcomes: dict[str, list[str]]) -> None:
    assert len(NAMES) >= 5
    assert sorted(outcomes) == NAMES
    assert len(outcomes["test_every_family_shares_a_burst_with_each_solo_tokens"]) > 50


@pytest.mark.parametrize("name", NAMES)
def test_shared_prefix(outcomes: dict[str, list[str]], name: str) -> None:
    failed = failures(outcomes, name)
    assert not failed, failed
