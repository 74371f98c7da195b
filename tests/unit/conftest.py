"""Shared fixtures for unit tests."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

MODEL_CONFIG = {"model_type": "llama", "num_hidden_layers": 4}


def make_model_dir(path: Path, config: object = MODEL_CONFIG) -> Path:
    """A directory that passes as an mlx-lm model for config purposes (no weights, no mlx)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    return path


class ConfigDir:
    """A scratch folder to write config files (dedented) and model dirs into."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def write(self, name: str, text: str) -> Path:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
        return path

    def model(self, name: str = "m", config: object = MODEL_CONFIG) -> Path:
        return make_model_dir(self.root / name, config)


@pytest.fixture
def cfg_dir(tmp_path: Path) -> ConfigDir:
    """A config folder holding a valid model dir `m`."""
    d = ConfigDir(tmp_path)
    d.model("m")
    return d


@pytest.fixture(scope="module")
def module_cfg_dir(tmp_path_factory: pytest.TempPathFactory) -> ConfigDir:
    """Like cfg_dir, shared by a module's tests (hypothesis runs many examples in one test)."""
    d = ConfigDir(tmp_path_factory.mktemp("cfg"))
    d.model("m")
    return d
