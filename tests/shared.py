"""What a test run makes once and every pytest-xdist worker shares: a directory in the run's
temporary root (each worker's own temporary directory lies inside it), and a made-once JSON
result in it, built by whichever worker asks first while the others wait on a file lock."""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest


def shared_dir(factory: pytest.TempPathFactory, name: str) -> Path:
    """`name` under the run's root: the same directory for every worker of this run."""
    base = factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    d = root / "shared" / name
    d.mkdir(parents=True, exist_ok=True)
    return d


@contextmanager
def locked(path: Path) -> Iterator[None]:
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        yield


def made_once(factory: pytest.TempPathFactory, name: str,
              make: Callable[[Path], Any]) -> Any:
    """make(directory)'s JSON result, made by the first worker to ask; read by the rest. A
    failed make leaves no result, so the next worker to ask fails the same way, on its own."""
    d = shared_dir(factory, name)
    done = d / "made.json"
    with locked(d / ".lock"):
        if done.exists():
            return json.loads(done.read_text())
        result = make(d)
        done.write_text(json.dumps(result))
        return result
