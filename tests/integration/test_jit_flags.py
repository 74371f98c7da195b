"""mlx's CPU kernels, in a runner, compiled for the machine's vector instructions
(exod.runner.cpu.jit_flags): through the runner's own g++, into a kernel cache of their own,
against a precompiled header built with the same flags, and computing what mlx's own ops do."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from exod.runner.cpu import jit_flags
from tests.gxx_reads import logging_gxx, preamble_reads
from tests.harness import REPO

PROBE = """
import json, os, sys
from exod.runner.cpu import jit_flags, jit_header
if len(sys.argv) > 1:
    jit_flags.SAME_BITS = sys.argv[1]  # flags that change the bits: the check must see it
said = jit_flags.install()
built = jit_header.ensure()
import mlx.core as mx
settled = jit_flags.settle(said)  # as the runner does: the check, the flags dropped if it fails
# A GELU no other test compiles: its kernel is compiled here, through whatever g++ is on PATH.
gelu = lambda x: x * (1 + mx.erf(x / 1.4142135623730951)) / 2 + 0.0078125
x = mx.random.normal((3000,), key=mx.random.key(3)) * 4
equal = mx.array_equal(mx.compile(gelu)(x), gelu(x)).item()
cache = jit_header.temp_dir() / "mlx" / mx.__version__ / "cpu"
print(json.dumps({"said": said and said.line, "settled": settled and settled.line,
                  "warning": settled is not None and settled.warning, "equal": equal,
                  "cache": str(cache), "tmpdir": os.environ.get("TMPDIR")}))
"""


def machine_has_them() -> bool:
    return bool(jit_flags.wanted(Path("/proc/cpuinfo").read_text(), platform.machine()))


def probe(tmp_path: Path, env: dict[str, str], *args: str) -> dict[str, object]:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    gxx = logging_gxx(tmp_path / "bin", tmp_path / "read.log")  # under the runner's shim
    res = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=REPO, capture_output=True,
                         text=True, timeout=300, check=False,
                         env={**os.environ, "TMPDIR": str(tmp), **gxx, **env})
    assert res.returncode == 0, res.stderr
    got: dict[str, object] = json.loads(res.stdout.strip().splitlines()[-1])
    return got


def fma_in_kernels(cache: Path) -> list[bool]:
    """For each kernel in the cache with an exp or an erf (mlx's are polynomials of fmas):
    whether its code holds a hardware fused multiply-add, not a call to libm's."""
    libs = sorted(p for p in cache.glob("lib*.so") if "Exp" in p.name or "Erf" in p.name)
    assert libs, f"no kernel was compiled into {cache}"
    return ["vfmadd" in subprocess.run(["objdump", "-d", str(lib)], capture_output=True,
                                       text=True, check=True).stdout for lib in libs]


def test_kernels_are_built_for_the_machine_in_a_cache_of_their_own(tmp_path: Path) -> None:
    got = probe(tmp_path, {})
    if not machine_has_them():  # not x86-64 with AVX2, FMA and F16C: mlx's own command
        assert got["said"] is None and got["tmpdir"] == str(tmp_path / "tmp"), got
        return
    home = tmp_path / "tmp" / "exod-mlx-avx2-fma-f16c"
    assert got["said"] == f"mlx's kernels compiled with -mavx2 -mfma -mf16c (kept in {home})"
    assert got["settled"] == got["said"] and got["warning"] is False, got
    assert got["tmpdir"] == str(home), got
    cache = Path(str(got["cache"]))
    assert cache.is_relative_to(home), got
    assert got["equal"] is True, got
    assert all(fma_in_kernels(cache)), "a kernel was compiled without the flags"
    # The precompiled header was built with the kernels' flags: every kernel used it.
    read = preamble_reads(tmp_path / "read.log")
    header = cache / "mlx/backend/cpu/compiled_preamble.h.gch"
    assert read and set(read) == {f"! {header}"}, read
    assert not (tmp_path / "tmp" / "mlx").exists(), "a kernel went to the shared cache"


def test_turned_off_mlx_compiles_as_its_wheel_does(tmp_path: Path) -> None:
    got = probe(tmp_path, {"EXOD_JIT_FLAGS": "0"})
    assert got["said"] is None and got["tmpdir"] == str(tmp_path / "tmp"), got
    assert got["equal"] is True, got
    # The same kernels without the flags: libm's fmaf, no hardware fma in their code.
    assert not any(fma_in_kernels(Path(str(got["cache"])))), got


def test_flags_that_change_the_bits_are_dropped(tmp_path: Path) -> None:
    if not machine_has_them():
        return  # nothing is installed to check: the first test covers this machine
    got = probe(tmp_path, {}, "-ffast-math")
    assert str(got["settled"]).startswith("mlx's kernels compiled as mlx's wheel does: a kernel "
                                          "built with them differs from mlx's own ops"), got
    assert got["warning"] is True, got
    assert got["tmpdir"] == str(tmp_path / "tmp"), got  # TMPDIR and PATH as they were


def test_a_folder_others_can_write_is_not_used(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The shim's folder is in a shared temporary folder: one that another user made, or left
    open to others, could hold a g++ (or kernels) of theirs, which mlx would run."""
    monkeypatch.setattr(jit_flags, "wanted", lambda cpuinfo, machine: ("-mavx2",))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("EXOD_JIT_FLAGS", "1")
    path = os.environ["PATH"]
    home = tmp_path / "exod-mlx-avx2"
    home.mkdir(mode=0o777)
    home.chmod(0o777)  # past the umask
    said = jit_flags.install()
    assert said == jit_flags.Said(f"mlx's kernels compiled as mlx's wheel does: {home} is "
                                  "writable by others (mode 777)", warning=True)
    home.rmdir()
    home.symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").mkdir()
    said = jit_flags.install()
    assert said is not None and said.line.endswith(f"{home} is not a folder"), said
    assert not (tmp_path / "elsewhere" / "bin").exists()
    assert os.environ["PATH"] == path and os.environ["TMPDIR"] == str(tmp_path)
    assert not jit_flags.active()
    home.unlink()
    said = jit_flags.install()  # its own folder: used, made for this user alone
    try:
        assert said == jit_flags.Said(f"mlx's kernels compiled with -mavx2 (kept in {home})")
        assert (home.stat().st_mode & 0o777, (home / "bin").stat().st_mode & 0o777) == \
            (0o700, 0o700)
        assert os.environ["PATH"].startswith(f"{home / 'bin'}:")
    finally:
        jit_flags.uninstall()
    assert os.environ["PATH"] == path and os.environ["TMPDIR"] == str(tmp_path)
