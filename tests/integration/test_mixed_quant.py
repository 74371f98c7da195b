"""Mixed-precision checkpoints, made the way users make them (`mlx_lm convert -q
--quant-predicate mixed_3_6`: 3-bit layers beside 6-bit ones, each with its own entry in
config.json's `quantization`), served in 1 rank, a 2-rank pipeline and 2-rank tensor
parallelism with the same greedy text as in-process mlx-lm. mlx work happens in subprocesses:
this process never imports mlx."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import REPO
from tests.zoo import EOS, MAX_TOKENS, OK, PROMPT, make_zoo, refusals, serve_zoo

FAMILIES = ["llama", "qwen3_moe"]  # a family's own shard(); MoE experts (SwitchGLU)
REFERENCE = """
import json, sys
from pathlib import Path
from tests.models.zoo import reference_text
print(json.dumps(reference_text(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]),
                                int(sys.argv[4]))))
"""


def python(*args: str) -> str:
    proc = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def mixed(src: Path, out: Path) -> dict[str, str]:
    python("-m", "mlx_lm", "convert", "--hf-path", str(src), "--mlx-path", str(out), "-q",
           "--q-group-size", "32", "--quant-predicate", "mixed_3_6")
    text = json.loads(python("-c", REFERENCE, str(out), PROMPT, str(MAX_TOKENS), str(EOS))
                      .strip().splitlines()[-1])
    return {"path": str(out), "text": text}


def test_mixed_precision_checkpoints_in_every_layout(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    root = tmp_path_factory.mktemp("mixed")
    plain = make_zoo(root / "plain", FAMILIES)
    zoo = {f"{f}-mixed": mixed(Path(plain[f]["path"]), root / f"{f}-mixed") for f in FAMILIES}
    for info in zoo.values():
        q = json.loads((Path(info["path"]) / "config.json").read_text())["quantization"]
        bits = {v["bits"] for v in q.values() if isinstance(v, dict)}
        assert bits == {3, 6}, bits  # really mixed: layers of both widths
    assert refusals(zoo) == {}
    served = serve_zoo(zoo, skip=set(), per_daemon=len(zoo))
    assert served == {(name, layout): OK for name in zoo for layout in ("one", "pp", "tp")}
