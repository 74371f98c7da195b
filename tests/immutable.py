"""Files that even root cannot remove (chattr +i), for tests of what exod does when it cannot
remove something; made immutable for one test and released after it."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def immutable_files() -> Iterator[Callable[[Path], None]]:
    """Yields `make(path)`: the file at `path` cannot be removed until the block ends (skips
    the test where chattr, root or the filesystem's support is missing)."""
    if shutil.which("chattr") is None or os.geteuid() != 0:
        pytest.skip("needs chattr and root")
    done: list[Path] = []

    def make(path: Path) -> None:
        res = subprocess.run(["chattr", "+i", str(path)], capture_output=True, check=False)
        if res.returncode:
            pytest.skip("this filesystem has no immutable files")
        done.append(path)

    try:
        yield make
    finally:
        for path in done:
            subprocess.run(["chattr", "-i", str(path)], check=False)
