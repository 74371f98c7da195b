from __future__ import annotations

from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterator

import pytest

from tests.harness import Daemon

# Misbehaving runners: a double that speaks the real protocol (see tests/doubles/runner.py).
# The daemon's environment (tests.harness.DOUBLES_ENV) makes it exec the double module.
def double_env(behaviour: str) -> dict[str, str]:
    return {"EXOD_DOUBLE": behaviour}


@pytest.fixture
def daemons() -> Iterator[Callable[..., Daemon]]:
    """Factory of daemons under test; every one is torn down (with its runners) afterwards."""
    made: list[Daemon] = []

    def make(config: dict[str, Any], **kw: Any) -> Daemon:
        d = Daemon(config, **kw)
        made.append(d)
        return d

    yield make
    for d in made:
        d.close()


@pytest.fixture
def fake_model(tmp_path: Path) -> Path:
    """A model directory for runner doubles: only config.json (doubles load nothing)."""
    d = tmp_path / "fake-model"
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "llama", "num_hidden_layers": 4}')
    return d
