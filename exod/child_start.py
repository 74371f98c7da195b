"""How exod starts a Python child (a runner, the zygote, a fetcher, the split probe, the demo
converter), written once: never importing from the working directory.

`python -m MODULE` puts the folder it starts in first on sys.path, so a folder that holds an
`exod/`, an `mlx/` or even a `runpy.py` would be imported in place of the installed code. So
every child runs in safe-path mode (`-P`, Python 3.11+), and in a folder exod owns. posix_spawn
cannot set a child's working directory, hence a bootstrap of a few lines (`-c`) in place of
`-m`: it changes to that folder, then runs the module as `-m` would (runpy.run_module). On
Python 3.10, which has no `-P`, its first line drops the entry `-c` puts there, before anything
is imported. `-I` is not used: it would also drop PYTHONPATH and the user's site-packages, which
an operator (or `pip install --user`) may rely on. An explicit PYTHONPATH keeps its meaning: its
relative entries are made absolute from the daemon's working directory, and its empty ones
(read as "the working directory", most often a stray colon) are dropped.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from exod import paths

# argv after it: FOLDER MODULE ARGS...; the module then sees `sys.argv[1:] == ARGS`.
BOOT = "\n".join((
    "import sys",
    "if sys.path[:1] == ['']: del sys.path[0]",
    "import os, runpy",
    "os.chdir(sys.argv[1])",
    "del sys.argv[:2]",
    "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)",
))
SAFE_PATH = ("-P",) if sys.version_info >= (3, 11) else ()


def python_argv(module: str, args: Sequence[str], cwd: Path | str) -> list[str]:
    """`python -m MODULE ARGS`, started in `cwd` with nothing of its own on sys.path."""
    return [sys.executable, *SAFE_PATH, "-c", BOOT, os.fspath(cwd), module, *args]


def explicit_path(env: Mapping[str, str], here: str | None = None) -> dict[str, str]:
    """`env` with PYTHONPATH's entries as they read from `here` (the daemon's working
    directory), for a child that runs elsewhere: relative ones absolute, empty ones gone."""
    out = dict(env)
    given = out.get("PYTHONPATH")
    if given is None:
        return out
    here = here if here is not None else _cwd()
    entries = []
    for entry in given.split(os.pathsep):
        if os.path.isabs(entry):
            entries.append(entry)
        elif entry and here is not None:
            entries.append(os.path.join(here, entry))
    if entries:
        out["PYTHONPATH"] = os.pathsep.join(entries)
    else:
        del out["PYTHONPATH"]
    return out


def _cwd() -> str | None:
    try:
        return os.getcwd()
    except OSError:  # deleted: a relative entry has no meaning left
        return None


def helper_dir() -> Path:
    """Where a helper that no daemon's runtime folder hosts runs (the split probe of `exod
    check` or of a config load, the demo converter): exod's cache folder, which they write to
    anyway; `/` (root's alone) where it cannot be made."""
    folder = paths.cache_dir()
    try:
        paths.make_dirs(folder, paths.PRIVATE)
    except OSError:
        return Path("/")
    return folder
