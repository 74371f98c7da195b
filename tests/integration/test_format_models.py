"""The format models (tests.models.formats): a tiny model per tool-call format real models
write, carrying the family's real chat template (fetched from PyPI, tests.models.templates).
The checks that need mlx (format_models_checks.py) run in a pytest process of their own
(tests/own_process.py), one test here per check function; the rest run here."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.models.families import FAMILIES, SKIPPED
from tests.own_process import check_names, failures, run_checks

CHECKS = Path(__file__).with_name("format_models_checks.py")
NAMES = check_names(CHECKS)


def test_every_format_mlx_lm_parses_has_a_family_or_a_reason() -> None:
    spec = importlib.util.find_spec("mlx_lm")  # found, not imported: no mlx here
    assert spec is not None and spec.submodule_search_locations
    folder = Path(next(iter(spec.submodule_search_locations))) / "tool_parsers"
    parsers = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
    covered = {f.format for f in FAMILIES.values()}
    assert parsers == (covered - {"harmony"}) | set(SKIPPED)
    assert "harmony" in covered and not covered & set(SKIPPED)


def test_every_family_names_a_real_template_and_its_own_tokens(chat_templates: Path) -> None:
    for family in FAMILIES.values():
        assert (chat_templates / family.template).is_file(), family.template
        named = {family.eos, family.call_end, family.answer_end, *family.eos_ids}
        named |= {t for t in (family.bos, family.pad) if t}
        assert named <= set(family.tokens), family.name


def test_format_models_are_made_for_every_family(format_models: dict[str, Path],
                                                 random_format_models: dict[str, Path]) -> None:
    assert sorted(format_models) == sorted(random_format_models) == sorted(FAMILIES)
    for steered, random in zip(format_models.values(), random_format_models.values(),
                               strict=True):
        a, b = (json.loads((d / "tokenizer_config.json").read_text()) for d in (steered,
                                                                              random))
        assert a["chat_template"] == b["chat_template"]


@pytest.fixture(scope="module")
def outcomes(format_models: dict[str, Path], random_format_models: dict[str, Path],
             tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    models = {f: [str(format_models[f]), str(random_format_models[f])] for f in FAMILIES}
    return run_checks(CHECKS, tmp_path_factory.mktemp("format-models"),
                      env={"EXOD_TEST_FORMAT_MODELS": json.dumps(models),
                           "HF_HUB_OFFLINE": "1"})


def test_every_check_was_collected(outcomes: dict[str, list[str]]) -> None:
    assert len(NAMES) >= 5
    assert sorted(outcomes) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_format_models(outcomes: dict[str, list[str]], name: str) -> None:
    failed = failures(outcomes, name)
    assert not failed, failed
