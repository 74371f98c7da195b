"""The shape of the code, checked so it stays that way: no import cycles inside exod/ (counting
imports made only for type checking or inside functions), no function past ~60 lines, a
runner that speaks to exod only over its channel (never NOTIFY_SOCKET), and no class name
defined by two modules unless both mean the same thing."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "exod"
MAX_FUNCTION_LINES = 60
# Class names that two modules define for the same thing, each with the modules that may.
SAME_CONCEPT = {
    # core's Protocols describe the config's dataclasses structurally: core imports no config.
    "BackoffPolicy": {"exod.config.schema", "exod.core.restarts"},
    "StartLimit": {"exod.config.schema", "exod.core.restarts"},
    "StopPolicy": {"exod.config.schema", "exod.core.ladder"},
    "KeepAliveBounds": {"exod.config.schema", "exod.core.keep_alive"},
    # The mask round's Protocol is the part of a row's grammar it uses.
    "Constraint": {"exod.runner.serving.grammar", "exod.runner.serving.mask_round"},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources() -> dict[str, ast.Module]:
    return {module_name(p): ast.parse(p.read_text(), str(p)) for p in PACKAGE.rglob("*.py")}


def imports(name: str, tree: ast.Module, known: set[str]) -> set[str]:
    """exod modules `name` imports anywhere (top level, functions, TYPE_CHECKING blocks)."""
    out: set[str] = set()
    package = name if (PACKAGE.parent / name.replace(".", "/") / "__init__.py").exists() \
        else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            # `from pkg import mod` imports pkg.mod when that is a module.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]
        else:
            continue
        out |= {t for t in targets if t in known and t != name}
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                found.append([*path[path.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def test_no_import_cycles_in_exod() -> None:
    trees = sources()
    known = set(trees)
    graph = {name: imports(name, tree, known) for name, tree in trees.items()}
    # A package's __init__ importing its own modules is how packages re-export: not a cycle.
    for name in graph:
        graph[name] = {t for t in graph[name] if not t.startswith(name + ".")}
    assert cycles(graph) == []


def test_the_cycle_finder_finds_cycles() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_function_is_too_long() -> None:
    long = []
    for p in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{p.relative_to(PACKAGE.parent)}:{node.lineno} "
                                f"{node.name} ({lines} lines)")
    assert long == []


def test_the_runner_speaks_only_over_its_channel() -> None:
    for p in (PACKAGE / "runner").rglob("*.py"):
        text = p.read_text()
        assert "NOTIFY_SOCKET" not in text and "sdnotify" not in text, p


def test_a_class_name_means_one_thing() -> None:
    """Two modules defining a class of one name is a second meaning for that name (a grep finds
    both; a reader confuses them): rename one, or list it in SAME_CONCEPT when it is the same."""
    where: dict[str, set[str]] = {}
    for name, tree in sources().items():
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, set()).add(name)
    twice = {cls: mods for cls, mods in where.items() if len(mods) > 1}
    assert {cls: sorted(mods) for cls, mods in twice.items()
            if mods != SAME_CONCEPT.get(cls)} == {}
    assert {cls: where.get(cls) for cls in SAME_CONCEPT
            if where.get(cls) != SAME_CONCEPT[cls]} == {}
