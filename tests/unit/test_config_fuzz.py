"""Whatever the file holds, load_config returns a Config or raises ConfigError: nothing else."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exod.config import Config, ConfigError, load_config, schema

if TYPE_CHECKING:
    from tests.unit.conftest import ConfigDir


def _schema_keys() -> list[str]:
    classes = [c for c in vars(schema).values()
               if isinstance(c, type) and dataclasses.is_dataclass(c)]
    return sorted({f.name for c in classes for f in dataclasses.fields(c)})


SCHEMA_KEYS = _schema_keys()

# No '/' or '~': a random `include:` must never glob outside the scratch folder.
SAFE_TEXT = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="/~\\"), max_size=12)
WORDS = st.sampled_from(["m", "10s", "500ms", "1m30s", "-5s", "0660", "no", "on-failure", "always",
                         "pipeline", "tensor", "auto", "bfloat16", "ring", "inc/*.yaml",
                         "none/*.yaml", "", "x", "big", "127.0.0.1:8000", "daemon"])
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10, 70000), st.integers(),
                    st.floats(), WORDS, SAFE_TEXT)
KEYS = st.one_of(st.sampled_from(SCHEMA_KEYS), st.sampled_from(["a", "big", "x-1", "-bad"]),
                 SAFE_TEXT)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.one_of(KEYS, st.integers()), inner, max_size=5)),
    max_leaves=30,
)
INSTANCE = st.dictionaries(st.sampled_from(SCHEMA_KEYS), VALUES, max_size=6).map(
    lambda d: {"model": "m", **d})
DOCUMENTS = st.one_of(
    VALUES,
    st.dictionaries(st.sampled_from(SCHEMA_KEYS), VALUES, max_size=6),
    st.fixed_dictionaries({"instances": st.dictionaries(KEYS, INSTANCE, max_size=3)},
                          optional={"defaults": VALUES, "include": VALUES, "control": VALUES}),
)
YAMLISH = st.text(alphabet=":- \n\t{}[]&*!#'\"|>%@`,?.0123456789abmsxyz<", max_size=120)


@pytest.fixture(scope="module")
def scratch(module_cfg_dir: ConfigDir) -> ConfigDir:
    module_cfg_dir.write("inc/a.yaml", "instances:\n  inc-a: {model: ../m}\n")
    return module_cfg_dir


def _check(path: Path) -> None:
    try:
        config = load_config(path)
    except ConfigError as e:
        assert e.problems and all(str(p) for p in e.problems)
        for problem in e.problems:
            assert "\n" not in problem.message, problem
    else:
        assert isinstance(config, Config)


FUZZ = settings(max_examples=200, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@FUZZ
@given(doc=DOCUMENTS)
def test_random_documents(scratch: ConfigDir, doc: object) -> None:
    path = scratch.root / "exod.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    _check(path)


@FUZZ
@given(text=st.one_of(YAMLISH, st.text(max_size=200)))
def test_random_text(scratch: ConfigDir, text: str) -> None:
    path = scratch.root / "exod.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    _check(path)


def test_a_valid_document_is_reachable(scratch: ConfigDir) -> None:
    """The strategies' own building blocks can make a good config, so the fuzz goes deep."""
    path = scratch.root / "exod.yaml"
    path.write_text(yaml.safe_dump({"include": "inc/*.yaml", "instances": {"big": {"model": "m"}}}))
    assert set(load_config(path).instances) == {"big", "inc-a"}
