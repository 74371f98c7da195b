"""A precompiled header for mlx's CPU kernels, kept in mlx's own kernel cache.

On CPU, mlx compiles each fused kernel it meets (mx.compile: mlx-lm's activations, exod's fused
decode step) with `g++ ... -I <mlx's include folder>` into $TMPDIR/mlx/<version>/cpu. Nearly
all of each compile is g++ parsing mlx's kernel preamble (its SIMD headers), paid again by every
kernel, each on the critical path of a forward.

g++ uses `X.h.gch` instead of `X.h` when it finds it first on the search path and it was built
with the same options; a quoted include is searched for first beside the file that includes it.
So a `mlx/backend/cpu/compiled_preamble.h.gch` in the kernel cache folder is used by every kernel
compiled there. It lives in the folder mlx names after its version, so an upgraded mlx never
meets a header built from another version's preamble; g++ checks the rest (its own version, the
options) and parses the real header whenever the precompiled one does not fit. Built once per
machine and mlx version, by the first runner that finds it missing, before its model's kernels
are compiled. What it saves and costs: `python -m bench jit_header`, docs/benchmarks.md.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from exod.paths import PRIVATE, make_dirs

HEADER = Path("mlx/backend/cpu/compiled_preamble.h")
# mlx's own command (mlx/backend/cpu/compiled.cpp, 0.32) less -shared, a link option: the
# precompiled header must be built with the options the kernels are compiled with.
OPTIONS = ("-std=c++17", "-O3", "-Wall", "-fPIC")
BUILD_LIMIT = 300.0  # seconds: an optimisation only; past this the runner goes on without it


def temp_dir() -> Path:
    """The folder C++'s std::filesystem::temp_directory_path names (libstdc++), where mlx keeps
    its kernels: the first of TMPDIR, TMP, TEMP, TEMPDIR that is set, else /tmp."""
    for name in ("TMPDIR", "TMP", "TEMP", "TEMPDIR"):
        value = os.environ.get(name)
        if value:
            return Path(value)
    return Path("/tmp")


def ensure() -> str | None:
    """Build the precompiled header where mlx's kernels are compiled, if it is missing; what
    was done, for the runner's log, or None (nothing to do, or it cannot be done here)."""
    if not sys.platform.startswith("linux") or shutil.which("g++") is None:
        return None
    try:
        import mlx.core as mx
    except ImportError:
        return None  # the runner says so where it needs mlx
    if mx.default_device() != mx.cpu:
        return None
    include = Path(mx.__file__).parent / "include"
    version = mx.__dict__["__version__"]  # the folder mlx names its kernel cache after
    target = temp_dir() / "mlx" / version / "cpu" / f"{HEADER}.gch"
    if target.exists() or not (include / HEADER).exists():
        return None
    try:
        return _build(include, target)
    except OSError as e:  # a read-only or full temporary folder: kernels compile as before
        return f"mlx's kernel header not precompiled: {e}"


def _build(include: Path, target: Path) -> str | None:
    make_dirs(target.parent, PRIVATE)  # mlx's own kernel cache: 0700 whatever the umask
    with open(target.parent / ".compiled_preamble.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None  # another runner is building it
        if target.exists():
            return None
        part = target.with_name(f".{target.name}.{os.getpid()}")
        t0 = time.monotonic()
        try:
            res = subprocess.run(["g++", *OPTIONS, "-I", str(include), "-x", "c++-header",
                                  str(include / HEADER), "-o", str(part)],
                                 capture_output=True, text=True, timeout=BUILD_LIMIT,
                                 check=False)
            if res.returncode != 0:
                why = res.stderr.strip().splitlines()[-1:] or [f"exit {res.returncode}"]
                return f"mlx's kernel header not precompiled: g++: {why[0]}"
            os.replace(part, target)  # whole or not at all, for runners compiling meanwhile
        except subprocess.TimeoutExpired:
            return f"mlx's kernel header not precompiled: g++ took over {BUILD_LIMIT:g}s"
        finally:
            part.unlink(missing_ok=True)
    return (f"precompiled mlx's kernel header in {time.monotonic() - t0:.1f}s "
            f"({target}): its CPU kernels now compile ~3x faster")
