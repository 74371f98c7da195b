"""The runners alike: one package a kind (text, vision, embed), each with its `serve`, picked by
the spec's kind alone, and a top of exod/runner/ that stays small."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

import pytest

from exod.wire.specs import RunnerKind

RUNNER = Path(__file__).resolve().parents[2] / "exod" / "runner"
MAX_TOP_MODULES = 9


def test_the_runner_s_top_holds_few_modules() -> None:
    top = sorted(p.name for p in RUNNER.glob("*.py"))
    assert len(top) <= MAX_TOP_MODULES, top


@pytest.mark.parametrize("kind", get_args(RunnerKind))
def test_each_kind_of_runner_has_its_package_and_its_path(kind: str) -> None:
    serve = RUNNER / kind / "serve.py"
    assert (RUNNER / kind / "__init__.py").is_file() and serve.is_file()
    tree = ast.parse(serve.read_text())
    assert any(isinstance(n, ast.FunctionDef) and n.name == "serve" for n in tree.body)
    main = ast.parse((RUNNER / "__main__.py").read_text())
    assert any(isinstance(n, ast.ImportFrom) and n.module == f"exod.runner.{kind}.serve"
               for n in ast.walk(main))


def test_no_runner_works_its_kind_out_from_the_model_s_files() -> None:
    """The daemon names the kind in the spec: the entry point reads no model facts for it."""
    main = ast.parse((RUNNER / "__main__.py").read_text())
    assert not [n.module for n in ast.walk(main) if isinstance(n, ast.ImportFrom)
                and (n.module or "").startswith("exod.facts")]
