"""Checks that import mlx, run in a pytest process of their own and reported here, one test per
check function: the suite's own processes must stay free of mlx (the daemon and its helpers are
shown not to need it, e.g. test_models' corrupt_model), and pytest-xdist workers collect every
test module, so a module that imported mlx would bring it into all of them."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def check_names(checks: Path) -> list[str]:
    """The test functions of a checks file, found without importing it."""
    return sorted(node.name for node in ast.parse(checks.read_text()).body
                  if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"))


def run_checks(checks: Path, tmp: Path, env: dict[str, str] | None = None,
               timeout: float = 600) -> dict[str, list[str]]:
    """Check function -> the failure reports of its cases ("" for a case that passed)."""
    report = tmp / "report.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(checks), "-q", "-p", "no:cacheprovider",
         f"--junitxml={report}"],
        check=False, capture_output=True, text=True, timeout=timeout,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")},
             **(env or {})})  # a pytest of its own, not another xdist worker
    assert report.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    found: dict[str, list[str]] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        bad = [e for e in case if e.tag in ("failure", "error", "skipped")]
        text = "\n".join(f"{e.tag}: {e.get('message', '')}\n{e.text or ''}" for e in bad)
        found.setdefault(case.get("name", "").split("[")[0], []).append(text)
    return found


def failures(outcomes: dict[str, list[str]], name: str) -> str:
    """"" when every case of check `name` ran and passed, else what went wrong."""
    cases = outcomes.get(name, [])
    if not cases:
        return f"{name} did not run"
    return "\n".join(c for c in cases if c)
