"""Which runner serves a model, told by its own files (exod.facts.vision): a vision_config, or
a model type only mlx-vlm has a module for; and the config check that refuses a model that sees
up front when the extra is missing (naming the install command) or when it is split."""

from __future__ import annotations

from pathlib import Path

import pytest

from exod.config import ConfigError, load_config
from exod.facts import vision
from tests.unit.conftest import ConfigDir

TEXT = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 64,
        "num_attention_heads": 4, "vocab_size": 1024}
SEEING = {"model_type": "qwen2_5_vl", "num_hidden_layers": 4, "hidden_size": 64,
          "num_attention_heads": 4, "vocab_size": 1024, "vision_config": {"depth": 2}}


@pytest.mark.parametrize("config, why", [
    (SEEING, "its config.json has a vision_config"),
    # A text checkpoint of a multimodal family (an empty or null vision_config): mlx-lm's.
    ({**SEEING, "vision_config": {}}, None),
    ({**SEEING, "vision_config": None}, None),
    (TEXT, None),
    # No vision_config, but only mlx-vlm has a module for the type (the test venv has the extra).
    ({**TEXT, "model_type": "smolvlm"}, "mlx-vlm serves its model type 'smolvlm' and mlx-lm "
                                        "does not"),
    # mlx-lm serves llava as its mistral3 (MODEL_REMAPPING, read from its source), as text.
    ({**TEXT, "model_type": "llava"}, None),
    ({**TEXT, "model_type": "no_such_family"}, None),
    ({**TEXT, "model_type": "../../etc"}, None),
    ({**TEXT, "model_type": ".."}, None),
], ids=str)
def test_a_model_sees_by_its_own_files(cfg_dir: ConfigDir, config: dict[str, object],
                                       why: str | None) -> None:
    assert vision.sees(cfg_dir.model("v", config)) == why


def test_an_unreadable_model_is_not_judged_here(tmp_path: Path) -> None:
    assert vision.sees(tmp_path / "missing") is None


def problems(d: ConfigDir, config: dict[str, object], body: str = "") -> list[str]:
    d.model("v", config)
    path = d.write("exod.yaml", "instances:\n  x:\n    model: v\n" + body)
    try:
        load_config(path)
    except ConfigError as e:
        return [str(p).removeprefix(f"{path}:") for p in e.problems]
    return []


def test_without_the_extra_a_model_that_sees_is_refused_with_the_install_command(
        cfg_dir: ConfigDir, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vision, "have_extra", lambda: False)
    got = problems(cfg_dir, SEEING)
    assert len(got) == 1 and got[0].startswith("3:12: instances.x.model: "), got
    assert "is a model that sees (its config.json has a vision_config)" in got[0]
    assert got[0].endswith("which is not installed: pip install 'exod[vision]'")
    assert problems(cfg_dir, TEXT) == []  # text models need no extra


def test_with_the_extra_a_model_that_sees_is_accepted_split_by_layers_only(
        cfg_dir: ConfigDir) -> None:
    """Split by layers, its tower whole on rank 0 (whether its layers split is the split
    probe's answer, as for text: tests/integration/test_vision_group.py)."""
    assert vision.have_extra()  # the test set-up installs it (make setup-test)
    assert problems(cfg_dir, SEEING) == []
    got = problems(cfg_dir, SEEING, "    shards: 2\n    parallelism: tensor\n")
    assert any(p.startswith("5:18: instances.x.parallelism: a model that sees is split by "
                            "layers only") for p in got), got
