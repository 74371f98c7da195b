"""transformers' lazy import table, kept on disk between runner starts.

Every `import mlx_lm` imports transformers, whose package builds its lazy import table by reading
every source file under transformers/models: a large share of what a runner spends before READY
(docs/development.md, Layout; docs/design/runner-start.md), paid again by every runner of every
start. The table depends on nothing but those files, so it is kept in the cache directory under a
digest of their names, sizes and modification times (and of the file that holds transformers'
function), and read back at the next start. Anything wrong with the cache (unwritable,
unreadable, malformed, a transformers without that function) falls back to transformers' own
function: the cache can save time, never change what gets imported.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.abc
import importlib.machinery
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from exod.paths import PRIVATE, cache_dir, make_dirs

MODULE = "transformers.utils.import_utils"
FUNCTION = "define_import_structure"
FORMAT = 1  # bumped whenever the file's layout changes, so an old file is never misread
# backends -> module -> names: what transformers' function returns.
Table = dict[frozenset[str], dict[str, set[str]]]
Define = Callable[..., Table]


def install(directory: Path | None = None) -> bool:
    """Have transformers' import table come from the cache from its first import on. False
    (nothing done) when transformers is already imported: its table is built by then."""
    if MODULE in sys.modules or "transformers" in sys.modules:
        return False
    sys.meta_path.insert(0, _Finder(directory or cache_dir() / "transformers-imports"))
    return True


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when transformers' import_utils is first imported, it lets the
    normal machinery load it and then wraps its table function, before transformers calls it."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != MODULE:
            return None
        sys.meta_path.remove(self)  # one use: the module is imported once
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module
        directory = self.directory

        def exec_module(module: ModuleType) -> None:
            run(module)
            real = getattr(module, FUNCTION, None)
            if callable(real) and getattr(module, "__file__", None):
                setattr(module, FUNCTION, cached(real, directory, Path(str(module.__file__))))

        loader.exec_module = exec_module  # type: ignore[method-assign]  # this instance only
        return spec


def cached(real: Define, directory: Path, logic: Path) -> Define:
    """`real` (transformers' function) with its results kept in `directory`; `logic` is the
    file that defines it, part of the key."""

    @functools.cache  # as transformers' own: the same object for a path
    def define(module_path: Any, prefix: str | None = None) -> Table:
        try:
            file: Path | None = directory / f"{key(str(module_path), prefix, logic)}.json"
        except Exception:  # noqa: BLE001 -- a tree it cannot read: transformers' own
            file = None
        table = _read(file) if file is not None else None
        if table is not None:
            return table
        table = real(module_path, prefix)
        if file is not None:
            _write(file, table)
        return table

    return define


def key(module_path: str, prefix: str | None, logic: Path) -> str:
    """Digest of what the table is built from: the tree of sources and the code reading it."""
    st = logic.stat()
    root = module_path if os.path.isdir(module_path) else os.path.dirname(module_path)
    parts = [FORMAT, module_path, prefix, str(logic), st.st_mtime_ns, st.st_size,
             tree_digest(os.path.realpath(root))]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]


@functools.cache
def tree_digest(root: str) -> str:
    """Every directory's name, and every .py file's name, size and modification time, under
    root (the files transformers reads): far cheaper than reading them
    (docs/design/runner-start.md)."""
    h = hashlib.sha256()
    todo = [root]
    while todo:
        d = todo.pop()
        with os.scandir(d) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            if e.name == "__pycache__":
                continue
            if e.is_dir():
                todo.append(e.path)
                h.update(f"d {e.path}\n".encode())
            elif e.name.endswith(".py"):
                st = e.stat()
                h.update(f"f {e.path} {st.st_size} {st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def encode(table: Table) -> list[Any]:
    return [[sorted(backends), {m: sorted(names) for m, names in modules.items()}]
            for backends, modules in table.items()]


def decode(data: Any) -> Table | None:
    """The table back from its JSON form, or None if it is not one."""
    if not isinstance(data, list):
        return None
    table: Table = {}
    for item in data:
        backends, modules = item  # a malformed item raises: the caller falls back
        if not isinstance(modules, dict) or not all(isinstance(b, str) for b in backends):
            return None
        table[frozenset(backends)] = {str(m): {str(n) for n in names}
                                      for m, names in modules.items()}
    return table


def _read(file: Path) -> Table | None:
    try:
        return decode(json.loads(file.read_text(encoding="utf-8")))
    except Exception:  # noqa: BLE001 -- missing, unreadable or malformed: built afresh
        return None


def _write(file: Path, table: Table) -> None:
    try:
        text = json.dumps(encode(table))
        make_dirs(file.parent, PRIVATE)
        tmp = file.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(file)  # whole or not at all: runners starting together race here
    except Exception:  # noqa: BLE001 -- an unwritable cache (or odd table) costs time only
        pass
