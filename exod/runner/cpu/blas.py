"""OpenBLAS for float32 on Linux CPU: the mlx-cpu wheel's reference BLAS is many times slower
(docs/development.md, Set-up).

Loading libopenblas with RTLD_GLOBAL before the first `import mlx` makes mlx resolve its BLAS
symbols there, with identical results. Must run before mlx is imported.
"""

from __future__ import annotations

import ctypes
import os
import sys

CANDIDATES = (
    "libopenblas.so.0",
    "/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/lib/aarch64-linux-gnu/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
)

HINT = (
    "OpenBLAS not found: float32 matmuls on CPU will be ~60x slower "
    "(Debian/Ubuntu: apt-get install libopenblas0-pthread)"
)


def preload() -> tuple[bool, str]:
    """(loaded, message). Does nothing on macOS (Metal/Accelerate) or with EXOD_OPENBLAS=0."""
    if not sys.platform.startswith("linux"):
        return False, "not Linux: OpenBLAS not needed"
    if os.environ.get("EXOD_OPENBLAS", "1") == "0":
        return False, "OpenBLAS disabled by EXOD_OPENBLAS=0"
    global _LIB
    for name in CANDIDATES:
        try:
            _LIB = ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            continue
        return True, f"using OpenBLAS ({name})"
    return False, HINT


_LIB: ctypes.CDLL | None = None  # the OpenBLAS that preload loaded


def threads() -> int | None:
    """The threads OpenBLAS runs a call on (OPENBLAS_NUM_THREADS, else a thread per core);
    None when preload loaded none."""
    return int(_LIB.openblas_get_num_threads()) if _LIB is not None else None


def set_threads(n: int) -> None:
    """OpenBLAS's threads for the calls to come (none may be under way: it is process-wide)."""
    if _LIB is not None:
        _LIB.openblas_set_num_threads(n)

