"""A g++ that says which headers each compile read, for the tests of mlx's kernel compiles
(test_jit_header, test_jit_flags). mlx runs "g++" from PATH, and so does a runner's own shim
(exod.runner.cpu.jit_flags): this one, first on PATH, runs the real one with -H."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

SAYS_WHAT_IT_READ = """#!/bin/sh
"$REAL_GXX" -H "$@" 2>>"$READ_LOG"
"""


def logging_gxx(folder: Path, log: Path) -> dict[str, str]:
    """Writes it into `folder` (made here); the environment that puts it first on PATH,
    appending what each compile read to `log`."""
    folder.mkdir()
    (folder / "g++").write_text(SAYS_WHAT_IT_READ)
    (folder / "g++").chmod(0o755)
    real = shutil.which("g++")
    assert real is not None, "g++ is installed by the test set-up (scripts/system-deps.sh)"
    return {"PATH": f"{folder}:{os.environ['PATH']}", "REAL_GXX": real, "READ_LOG": str(log)}


def preamble_reads(log: Path) -> list[str]:
    """The log's lines on mlx's kernel preamble, one per compile: g++ -H marks a precompiled
    header it used with "!", a header it parsed with dots."""
    return [line for line in log.read_text().splitlines()
            if line.startswith(("!", ".")) and "compiled_preamble" in line]
