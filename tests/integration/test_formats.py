"""Every tool-call format through exod's engine (format_checks.py, run in a pytest process of its
own: it imports mlx; see tests/own_process.py): each family's steered model's calls parsed with
their reasoning apart and sent back through the family's template, random weights leaking no
markup over many seeds, and forced calls that validate. One test here per check function there,
failing with that check's report. Through the API, with real agents: test_agents.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.own_process import check_names, failures, run_checks

CHECKS = Path(__file__).with_name("format_checks.py")
NAMES = check_names(CHECKS)


@pytest.fixture(scope="module")
def outcomes(format_models: dict[str, Path], random_format_models: dict[str, Path],
             tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    return run_checks(CHECKS, tmp_path_factory.mktemp("formats"), env={
        "EXOD_FORMAT_MODELS": json.dumps({f: str(p) for f, p in format_models.items()}),
        "EXOD_RANDOM_FORMAT_MODELS": json.dumps(
            {f: str(p) for f, p in random_format_models.items()}),
        "HF_HUB_OFFLINE": "1"})


def test_every_check_was_collected(outcomes: dict[str, list[str]]) -> None:
    assert len(NAMES) >= 3
    assert sorted(outcomes) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_formats(outcomes: dict[str, list[str]], name: str) -> None:
    failed = failures(outcomes, name)
    assert not failed, failed
    # Every family ran: a check whose models were missing would pass on no cases.
    assert len(outcomes[name]) >= 14, outcomes[name]
