"""What the wheel ships is what exod runs: every module under exod/ is reachable from an entry
point (the console scripts, or a module the package itself runs with `python -m`), and none
imports the test suite or the benchmarks. A test-model generator placed in the package, imported
only by tests/ and bench/, fails here; they live in tests/models/."""

from __future__ import annotations

import ast
from importlib.metadata import distribution

from tests.unit.test_structure import PACKAGE, imports, sources

OUTSIDE = ("tests", "bench")  # top-level packages of the checkout that are not shipped


def entry_points() -> set[str]:
    """The console scripts' modules, as installed from pyproject's [project.scripts]."""
    return {ep.module for ep in distribution("exod").entry_points
            if ep.group == "console_scripts"}


def named_modules(tree: ast.Module, known: set[str]) -> set[str]:
    """Modules a source names in a string (what it runs with `python -m`), and for a package
    its __main__."""
    names = {node.value for node in ast.walk(tree)
             if isinstance(node, ast.Constant) and isinstance(node.value, str)
             and node.value in known}
    return names | {f"{n}.__main__" for n in names if f"{n}.__main__" in known}


def reachable(roots: set[str], edges: dict[str, set[str]]) -> set[str]:
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # importing runs parents
        todo += sorted(edges.get(name, set()))
    return seen


def test_every_module_in_the_package_is_used_by_exod() -> None:
    trees = sources()
    known = set(trees)
    edges = {name: imports(name, tree, known) | named_modules(tree, known)
             for name, tree in trees.items()}
    assert sorted(known - reachable(entry_points(), edges)) == []


def test_the_reachability_check_finds_a_module_only_tests_use() -> None:
    edges = {"exod.cli": {"exod.runner"}, "exod.runner": set(), "exod.gen": set()}
    assert reachable({"exod.cli"}, edges) == {"exod", "exod.cli", "exod.runner"}


def test_no_module_in_the_package_imports_tests_or_bench() -> None:
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                targets = [node.module or ""]
            else:
                continue
            found += [f"{path.relative_to(PACKAGE.parent)}: {t}" for t in targets
                      if t.split(".")[0] in OUTSIDE]
    assert found == []

