"""The model preparation tools make directories that mlx-lm really loads and runs.

mlx work happens in subprocesses (as in the runner), so this process never imports mlx.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.models.tiny import corrupt_model

REPO_ROOT = Path(__file__).resolve().parents[2]

# argv: max_tokens then "eager:DIR" / "lazy:DIR" items; prints {item: greedy chat reply}.
GENERATE = r"""
import json, sys
import mlx.core as mx
import mlx_lm
from mlx_lm.sample_utils import make_sampler
from mlx_lm.utils import load

max_tokens, *items = sys.argv[1:]
replies = {}
for item in items:
    mode, path = item.split(":", 1)
    if mode == "lazy":
        model, tokenizer = load(path, lazy=True)
        for layer in model.model.layers:  # layer by layer, as the runner loads
            mx.eval(layer.parameters())
        mx.eval(model.parameters())
    else:
        model, tokenizer = mlx_lm.load(path)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True)
    replies[item] = mlx_lm.generate(model, tokenizer, prompt, max_tokens=int(max_tokens),
                                    sampler=make_sampler(temp=0.0))
print(json.dumps(replies))
"""


def _python(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, *args], check=False, cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _generate(*items: str, max_tokens: int = 16) -> dict[str, str]:
    proc = _python("-c", GENERATE, str(max_tokens), *items)
    assert proc.returncode == 0, proc.stderr
    replies: dict[str, str] = json.loads(proc.stdout.strip().splitlines()[-1])
    return replies


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_tiny_model_generates_the_same_text_in_two_processes(tiny_model: Path) -> None:
    first = _generate(f"eager:{tiny_model}")[f"eager:{tiny_model}"]
    second = _generate(f"eager:{tiny_model}")[f"eager:{tiny_model}"]
    assert first.strip()
    assert first == second


def test_sharded_model_has_an_index_and_the_same_weights(
    tiny_model: Path, tiny_model_factory: Callable[..., Path]
) -> None:
    sharded = tiny_model_factory(shards_files=3)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert files == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    assert sum((sharded / f).stat().st_size for f in files) > index["metadata"]["total_size"]
    assert not (sharded / "model.safetensors").exists()
    # Same seed, other file layout: the same model, hence the same greedy reply.
    replies = _generate(f"eager:{tiny_model}", f"eager:{sharded}")
    assert replies[f"eager:{tiny_model}"] == replies[f"eager:{sharded}"]


def test_lazy_layer_by_layer_load_matches_eager_load(
    tiny_model_factory: Callable[..., Path],
) -> None:
    sharded = tiny_model_factory(shards_files=3)
    replies = _generate(f"lazy:{sharded}", f"eager:{sharded}")
    assert replies[f"lazy:{sharded}"] == replies[f"eager:{sharded}"]


def test_same_parameters_give_identical_files_and_a_cached_rerun(
    tiny_model: Path, tmp_path: Path
) -> None:
    again = tmp_path / "again"
    cli = ["-m", "tests.models.tiny", str(again)]
    made = _python(*cli)
    assert made.returncode == 0, made.stderr
    assert Path(made.stdout.splitlines()[-1]) == again
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert _sha256(again / name) == _sha256(tiny_model / name), name
    before = {p.name: p.stat().st_mtime_ns for p in again.iterdir()}
    rerun = _python(*cli)
    assert rerun.returncode == 0, rerun.stderr
    assert {p.name: p.stat().st_mtime_ns for p in again.iterdir()} == before


def test_tiny_cli_refuses_to_replace_a_directory_it_did_not_make(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    proc = _python("-m", "tests.models.tiny", str(tmp_path))
    assert proc.returncode == 2, proc.stderr  # click usage error
    assert "not made by exod" in proc.stderr
    assert (tmp_path / "precious.txt").read_text() == "keep me"


@pytest.mark.parametrize("how", ["truncate", "header"])
def test_corrupt_model_fails_to_load_with_an_error(
    tiny_model: Path, tmp_path: Path, how: str
) -> None:
    broken = corrupt_model(tiny_model, tmp_path / "broken", how)  # type: ignore[arg-type]
    assert "mlx" not in sys.modules  # corrupt_model is plain file work
    for loader in ("mlx_lm.load(path)", "mlx_lm.utils.load(path, lazy=True)"):
        proc = _python("-c", f"import sys, mlx_lm, mlx_lm.utils; path = sys.argv[1]; {loader}",
                       str(broken))
        # An exception (exit 1), not a crash by signal.
        assert proc.returncode == 1, (loader, proc.returncode, proc.stderr)
        assert "RuntimeError" in proc.stderr, proc.stderr


def test_demo_model_knows_the_capital_of_france(demo_model: Path) -> None:
    config = json.loads((demo_model / "config.json").read_text())
    assert config["model_type"] == "llama"
    reply = _generate(f"eager:{demo_model}", max_tokens=20)[f"eager:{demo_model}"]
    assert "Paris" in reply
