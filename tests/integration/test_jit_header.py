"""mlx's CPU kernels compile against the precompiled header a runner leaves in mlx's kernel
cache (exod.runner.cpu.jit_header), and compute what they computed without it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.gxx_reads import logging_gxx, preamble_reads
from tests.harness import REPO

PROBE = """
import json
from exod.runner.cpu import jit_header
import mlx.core as mx

first, second = jit_header.ensure(), jit_header.ensure()
f = lambda a, b: mx.tanh(mx.sigmoid(a) * b) - 0.125  # a kernel no test compiles elsewhere
a, b = mx.arange(16, dtype=mx.float32) / 7, mx.full((16,), 3.0)
equal = mx.array_equal(mx.compile(f)(a, b), f(a, b)).item()
cache = jit_header.temp_dir() / "mlx" / mx.__version__ / "cpu"
print(json.dumps({"first": first, "second": second, "equal": equal, "cache": str(cache)}))
"""


def run(code: str, tmp: Path, env: dict[str, str]) -> str:
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, "TMPDIR": str(tmp), **env}, timeout=300,
                         check=False)
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_kernels_compile_against_the_header_built_once_per_kernel_cache(tmp_path: Path) -> None:
    log, tmp = tmp_path / "read.log", tmp_path / "tmp"
    tmp.mkdir()
    gxx = logging_gxx(tmp_path / "bin", log)
    got = json.loads(run(PROBE, tmp, gxx).strip().splitlines()[-1])
    header = Path(got["cache"]) / "mlx/backend/cpu/compiled_preamble.h.gch"
    assert header.is_file()
    assert str(got["first"]).startswith("precompiled mlx's kernel header"), got
    assert got["second"] is None, got  # built already: nothing to do
    assert got["equal"] is True, got
    read = preamble_reads(log)
    assert read == [f"! {header}"], read


def test_a_kernel_cache_that_cannot_be_written_is_no_error(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("TMPDIR names a file: no folder can be made in it\n")
    said = run("from exod.runner.cpu import jit_header; print(jit_header.ensure())", blocked, {})
    assert said.startswith("mlx's kernel header not precompiled: "), said
