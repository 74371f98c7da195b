"""On x86-64 Linux, mlx's CPU kernels compiled for the instructions the machine has.

mlx builds each fused kernel it meets (mx.compile) with the `g++` on PATH, and the x86-64
wheel's command targets the baseline CPU: every `std::fma` in mlx's SIMD exp and erf is a call
into libm. mlx's own source adds `-mavx2 -mfma -mf16c` only when the library is built for AVX2,
which the wheel is not. So a runner on a CPU with all three puts a `g++` of its own first on its
PATH (a two-line script beside its kernels) that passes those flags to the real compiler. The
bits stay the same (an fma is exact in hardware as in libm; g++'s ISO C++ mode fuses nothing
the source does not, `-ffp-contract=off` to leave no doubt); `check()` confirms it before the
model loads and drops the flags otherwise, and `settle` drops them on a GPU.

Those kernels live in a cache of their own (TMPDIR becomes a folder named after the flags), so
no other mlx program loads them, nor they its; a folder of that name that is not this user's
alone (0700) is not used, since what is there is run. EXOD_JIT_FLAGS=0: off. docs/api.md, "mlx's
kernels built for the CPU's instructions"; `python -m bench jit_flags`.
"""

from __future__ import annotations

import os
import platform
import shutil
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from exod.paths import PRIVATE, make_dirs
from exod.runner.cpu.jit_header import temp_dir

# What mlx's source passes for a build with AVX2, each with the /proc/cpuinfo flag it needs.
FLAGS = (("-mavx2", "avx2"), ("-mfma", "fma"), ("-mf16c", "f16c"))
SAME_BITS = "-ffp-contract=off"  # ISO C++'s default, said again: no fma the source lacks
SHIM = "g++"


def wanted(cpuinfo: str, machine: str) -> tuple[str, ...]:
    """The flags to add, from /proc/cpuinfo's text: all of FLAGS where the CPU has every one
    of their instructions (mlx's source adds them together), else none."""
    if machine not in ("x86_64", "AMD64"):
        return ()
    have: set[str] = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            have = set(line.partition(":")[2].split())
            break
    return tuple(f for f, need in FLAGS) if all(need in have for _, need in FLAGS) else ()


def script(compiler: str, flags: tuple[str, ...]) -> str:
    """The shim: the real compiler with the flags first (mlx's own options follow)."""
    return f'#!/bin/sh\nexec "{compiler}" {" ".join(flags)} {SAME_BITS} "$@"\n'


@dataclass(frozen=True)
class Said:
    """A line for the runner's log, and whether it is a warning (the flags are not used)."""

    line: str
    warning: bool = False


def unused(why: str) -> Said:
    return Said(f"mlx's kernels compiled as mlx's wheel does: {why}", warning=True)


def install() -> Said | None:
    """Put the shim first on this process's PATH and point TMPDIR at the kernels' own cache;
    before mlx compiles anything. What was done, or None (nothing to do here)."""
    if not sys.platform.startswith("linux") or os.environ.get("EXOD_JIT_FLAGS", "1") == "0":
        return None
    compiler = shutil.which("g++")
    if compiler is None:
        return None
    try:
        flags = wanted(Path("/proc/cpuinfo").read_text(), platform.machine())
    except OSError:
        return None
    if not flags:
        return None
    tag = "-".join(f.removeprefix("-m") for f in flags)
    home = temp_dir() / f"exod-mlx-{tag}"
    shim = home / "bin" / SHIM
    text = script(compiler, flags)
    try:
        for folder in (home, shim.parent):
            make_dirs(folder, PRIVATE)
            why = not_own(folder)
            if why is not None:  # whoever can write there could run code as this runner
                return unused(f"{folder} {why}")
        if not shim.exists() or shim.read_text() != text:
            part = shim.with_name(f".{SHIM}.{os.getpid()}")
            part.write_text(text)
            part.chmod(0o755)
            os.replace(part, shim)  # whole: another runner may be compiling through it
    except OSError as e:  # a read-only temporary folder: mlx compiles as it does by default
        return unused(str(e))
    _saved.update({k: os.environ.get(k) for k in ("PATH", "TMPDIR")})
    # os.environ writes the C environment too, which mlx's popen("g++ ...") reads.
    os.environ["PATH"] = f"{shim.parent}{os.pathsep}{os.environ.get('PATH', '')}"
    os.environ["TMPDIR"] = str(home)
    return Said(f"mlx's kernels compiled with {' '.join(flags)} (kept in {home})")


def not_own(folder: Path) -> str | None:
    """Why `folder` may not hold what this process runs: a link, another user's, or writable
    by others (a temporary folder is shared: mlx would run the g++ found there and load the
    kernels found there). None: it is this user's own."""
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode):
        return "is not a folder"
    if st.st_uid != os.getuid():
        return f"belongs to uid {st.st_uid}"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


_saved: dict[str, str | None] = {}  # PATH and TMPDIR as they were before install


def active() -> bool:
    return bool(_saved)


def uninstall() -> None:
    """Back to mlx's own compiler command and temporary folder."""
    for name, value in _saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    _saved.clear()


def settle(said: Said | None) -> Said | None:
    """After `install`, before the model loads: keep the flags where mlx computes on a CPU and
    `check` passes, else go back to mlx's compiler command. What to log, or None."""
    if not active():
        return said
    import mlx.core as mx

    if mx.default_device() != mx.cpu:  # a GPU build: its kernels are not g++'s
        uninstall()
        return None
    why = check()
    if why is None:
        return said
    uninstall()
    return unused(why)


def check() -> str | None:
    """After install, with mlx imported: one kernel of exp, erf and a sigmoid, built
    through the shim, gives what the same ops give one by one from mlx's library (NaN for NaN),
    for float32, float16 and bfloat16, over values that include zeros, infinities, NaN and the
    ends of each range. Why not, or None."""
    import mlx.core as mx

    def f(x: mx.array) -> mx.array:  # one kernel: mlx compiles each output apart
        return mx.exp(x) * 0.5 + mx.erf(x * 0.7071067811865476) - x * mx.sigmoid(x)

    edges = [0.0, -0.0, float("inf"), -float("inf"), float("nan"), 88.5, -88.5, 1e-30, -1e-30,
             65504.0, -65504.0, 3.4e38, -3.4e38]
    try:
        for dtype in (mx.float32, mx.float16, mx.bfloat16):
            x = mx.concatenate([mx.random.normal((4093,), key=mx.random.key(7)) * 12,
                                mx.array(edges)]).astype(dtype)
            fused, plain = mx.compile(f)(x), f(x)
            mx.eval(fused, plain)
            if not mx.array_equal(fused, plain, equal_nan=True).item():
                return f"a kernel built with them differs from mlx's own ops ({dtype})"
    except Exception as e:  # noqa: BLE001 -- the compiler refused a flag, or mlx raised
        return f"{type(e).__name__}: {e}"
    return None
