"""`make test` runs the tiers with pytest-xdist, and the tests that share a module-scoped daemon
rely on `--dist loadgroup` keeping them on one worker (tests/conftest.py groups them). A pytest
and xdist pair that stops grouping fails here instead of silently having every worker start its
own daemons (pytest 9.2 with xdist 3.8 did: pytest-xdist#1386)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

MODULE = """
import os
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def shared():
    return "one per worker that runs this module"


@pytest.mark.parametrize("i", range(8))
def test_shared(shared, i):
    with Path(os.environ["WORKERS_SEEN"]).open("a") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
"""


def test_a_module_sharing_a_fixture_runs_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_grouped.py").write_text(textwrap.dedent(MODULE))
    seen = tmp_path / "seen"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-n", "2", "--dist",
         "loadgroup", "--no-loadscope-reorder", "-p", "no:cacheprovider", "-q",
         "--rootdir", str(tmp_path), str(tmp_path / "test_grouped.py")],
        cwd=REPO, env={**os.environ, "WORKERS_SEEN": str(seen)}, capture_output=True,
        text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    workers = seen.read_text().split()
    assert len(workers) == 8 and len(set(workers)) == 1, workers
