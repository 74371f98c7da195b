"""The prompt cache's disk tier in the batch engine, checked in a pytest process of its own
(prompt_cache_checks.py; see tests/own_process.py): every family of the zoo gives the cold
tokens from an entry loaded after a restart (or is a documented miss), a stop or a cancel during
a load, a corrupt entry, a warm prompt, an entry out of RAM written behind the requests, the
next turn from an entry still being written and from one bigger than the RAM tier and the
writer's queue, the stop's flush bounded by its deadline, a group's miss counted as none. One
test here per check function there, failing with that check's report. Through daemons,
restarts and the ladder: test_prompt_cache.py. The zoo is the one test_families.py makes
(once per run, shared); ~0.4 CPU-s a family here, ~60 CPU-s in all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.test_families import make
from tests.own_process import check_names, failures, run_checks
from tests.shared import made_once

CHECKS = Path(__file__).with_name("prompt_cache_checks.py")
NAMES = check_names(CHECKS)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> dict[str, list[str]]:
    zoo = made_once(tmp_path_factory, "zoo", make)
    return run_checks(CHECKS, tmp_path_factory.mktemp("prompt-cache"), timeout=1800,
                      env={"EXOD_TEST_TINY": str(tiny_model), "HF_HUB_OFFLINE": "1",
                           "EXOD_TEST_ZOO_JSON": json.dumps(zoo)})


def test_every_check_was_collected(outcomes: dict[str, list[str]]) -> None:
    assert len(NAMES) >= 4
    assert sorted(outcomes) == NAMES
    assert len(outcomes["test_every_family_hits_after_a_restart_with_the_cold_tokens"]) > 100


@pytest.mark.parametrize("name", NAMES)
def test_prompt_cache(outcomes: dict[str, list[str]], name: str) -> None:
    failed = failures(outcomes, name)
    assert not failed, failed
