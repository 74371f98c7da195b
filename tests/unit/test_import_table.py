"""exod.runner.start.import_table's cache, around a stand-in for transformers' table function over a
small source tree: built once, then read; built again when a source changes or the cache file is
bad; an unwritable cache costs time only. (Real transformers: tests/integration/
test_import_table.py.)"""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from exod.runner.start import import_table
from exod.runner.start.import_table import Table

TABLE: Table = {frozenset({"torch"}): {"models.a.modeling_a": {"AModel"}},
                frozenset(): {"models.a.configuration_a": {"AConfig", "BConfig"}}}


class Real:
    """transformers' function: counts its calls, returns a fresh TABLE each time."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, module_path: Any, prefix: str | None = None) -> Table:
        self.calls += 1
        return {k: {m: set(n) for m, n in v.items()} for k, v in TABLE.items()}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    (root / "a" / "__pycache__").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "a" / "modeling_a.py").write_text("__all__ = ['AModel']\n")
    (root / "a" / "notes.txt").write_text("not read by transformers")
    return root


def start(real: Real, cache: Path, tree: Path) -> Table:
    """One process start: a fresh wrapper (and digests), the table of the tree."""
    import_table.tree_digest.cache_clear()
    logic = cache.parent / "import_utils.py"
    if not logic.exists():
        logic.write_text("def define_import_structure(): ...")
    return import_table.cached(real, cache, logic)(tree, prefix="models")


def test_a_table_is_built_once_then_read(tree: Path, tmp_path: Path) -> None:
    real, cache = Real(), tmp_path / "cache"
    assert start(real, cache, tree) == TABLE
    assert start(real, cache, tree) == TABLE
    assert real.calls == 1
    assert len(list(cache.glob("*.json"))) == 1


def test_a_changed_added_or_removed_source_builds_it_again(tree: Path, tmp_path: Path) -> None:
    real, cache = Real(), tmp_path / "cache"
    start(real, cache, tree)
    (tree / "a" / "modeling_a.py").write_text("__all__ = ['AModel', 'APreTrained']\n")
    start(real, cache, tree)
    (tree / "b").mkdir()
    start(real, cache, tree)
    (tree / "b" / "configuration_b.py").write_text("__all__ = ['BConfig']\n")
    start(real, cache, tree)
    assert real.calls == 4
    (tree / "b" / "configuration_b.py").unlink()  # back to a tree already seen: read
    assert start(real, cache, tree) == TABLE
    assert real.calls == 4


def test_files_transformers_does_not_read_change_nothing(tree: Path, tmp_path: Path) -> None:
    real, cache = Real(), tmp_path / "cache"
    start(real, cache, tree)
    (tree / "a" / "notes.txt").write_text("longer than it was before")
    (tree / "a" / "__pycache__" / "modeling_a.cpython-311.pyc").write_bytes(b"\0" * 9)
    start(real, cache, tree)
    assert real.calls == 1


@pytest.mark.parametrize("bad", ["{not json", "[]]", '[["torch"]]', '[[1, {"m": ["A"]}]]',
                                 '{"a": 1}'])
def test_a_bad_cache_file_is_built_again_and_replaced(tree: Path, tmp_path: Path,
                                                      bad: str) -> None:
    real, cache = Real(), tmp_path / "cache"
    start(real, cache, tree)
    (file,) = cache.glob("*.json")
    file.write_text(bad)
    assert start(real, cache, tree) == TABLE
    assert start(real, cache, tree) == TABLE
    assert real.calls == 2  # built again once, then read from the rewritten file


def test_an_unusable_cache_costs_time_only(tree: Path, tmp_path: Path) -> None:
    real, blocked = Real(), tmp_path / "a-file"
    blocked.write_text("a file where the cache directory would be")
    assert start(real, blocked, tree) == TABLE
    assert start(real, blocked, tree) == TABLE
    assert real.calls == 2


def test_a_tree_it_cannot_read_falls_back(tmp_path: Path) -> None:
    real = Real()
    assert start(real, tmp_path / "cache", tmp_path / "gone" / "models") == TABLE
    assert real.calls == 1 and not (tmp_path / "cache").exists()


def test_the_same_path_gives_the_same_object_within_a_process(tree: Path,
                                                               tmp_path: Path) -> None:
    """As transformers' own function (an lru_cache), which its package relies on."""
    define = import_table.cached(Real(), tmp_path / "cache", tree / "__init__.py")
    assert define(tree) is define(tree)


def test_install_after_transformers_is_imported_does_nothing(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "transformers", ModuleType("transformers"))
    before = list(sys.meta_path)
    assert import_table.install(tmp_path) is False
    assert sys.meta_path == before
