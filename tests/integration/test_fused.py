"""exod.runner.cpu.fused, checked in a pytest process of its own (fused_checks.py): the checks
import mlx and swap mx.fast's functions, and the suite's own process must stay free of both (the
daemon and its helpers are shown not to need mlx, e.g. test_models' corrupt_model). One test here
per check function there, failing with that check's report."""

from __future__ import annotations

import ast
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

CHECKS = Path(__file__).with_name("fused_checks.py")
NAMES = sorted(node.name for node in ast.parse(CHECKS.read_text()).body
               if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"))


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Check function -> the failure reports of its cases ("" for a case that passed)."""
    report = tmp_path_factory.mktemp("fused") / "report.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(CHECKS), "-q", "-p", "no:cacheprovider",
         f"--junitxml={report}"],
        check=False, capture_output=True, text=True, timeout=600)
    assert report.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    found: dict[str, list[str]] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        bad = [e for e in case if e.tag in ("failure", "error", "skipped")]
        text = "\n".join(f"{e.tag}: {e.get('message', '')}\n{e.text or ''}" for e in bad)
        found.setdefault(case.get("name", "").split("[")[0], []).append(text)
    return found


def test_every_check_was_collected(outcomes: dict[str, list[str]]) -> None:
    assert len(NAMES) >= 5
    assert sorted(outcomes) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_fused(outcomes: dict[str, list[str]], name: str) -> None:
    cases = outcomes.get(name, [])
    assert cases, f"{name} did not run"
    failed = [c for c in cases if c]
    assert not failed, "\n".join(failed)
