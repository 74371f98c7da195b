"""The batch engine with a quantized KV cache on the tiny model, against in-process mlx-lm,
checked in a pytest process of its own (quantized_kv_checks.py; see tests/own_process.py). One
test here per check function there. Through a daemon: test_mlx_options.py (several requests
in one batch) and test_prompt_cache.py (the disk tier after a restart)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.own_process import check_names, failures, run_checks

CHECKS = Path(__file__).with_name("quantized_kv_checks.py")
NAMES = check_names(CHECKS)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> dict[str, list[str]]:
    return run_checks(CHECKS, tmp_path_factory.mktemp("quantized-kv"),
                      env={"EXOD_TEST_TINY": str(tiny_model), "HF_HUB_OFFLINE": "1"})


def test_every_check_was_collected(outcomes: dict[str, list[str]]) -> None:
    assert len(NAMES) >= 3
    assert sorted(outcomes) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_quantized_kv(outcomes: dict[str, list[str]], name: str) -> None:
    failed = failures(outcomes, name)
    assert not failed, failed
