"""The daemon and the CLIs never import the engines: everything the console scripts reach by
import (at the top, in a function or for type checking) stays clear of mlx, mlx-lm, mlx-vlm and
what they drag in, so they start fast and run without the optional extra `exod[vision]`. And
mlx-vlm is imported in two packages only (exod.runner.vision and exod.runner.embed: the models
that see, and the embedding models and rerankers), the places that say what to install when
it is missing."""

from __future__ import annotations

import ast

from tests.unit.test_package_contents import entry_points, reachable
from tests.unit.test_structure import PACKAGE, imports, sources

# Engines and the heavy libraries they bring (transformers, images, arrays).
HEAVY = frozenset({"mlx", "mlx_lm", "mlx_vlm", "transformers", "tokenizers", "PIL", "cv2",
                   "numpy", "torch"})
VLM_HOMES = ("exod.runner.vision", "exod.runner.embed")


def external_imports(tree: ast.Module) -> set[str]:
    """Top-level names of the packages outside exod that a source imports anywhere."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out - {"exod"}


def heavy_imports(roots: set[str], trees: dict[str, ast.Module]) -> list[str]:
    """`module: package` for each heavy package a module reachable from `roots` imports."""
    known = set(trees)
    edges = {name: imports(name, tree, known) for name, tree in trees.items()}
    return sorted(f"{name}: {pkg}" for name in reachable(roots, edges) if name in trees
                  for pkg in external_imports(trees[name]) & HEAVY)


def test_the_daemon_and_the_clis_import_no_engine() -> None:
    assert heavy_imports(entry_points(), sources()) == []


def test_the_check_sees_an_engine_imported_through_another_module() -> None:
    trees = {
        "exod.cli.x": ast.parse("def f():\n    from exod.daemon import y\n"),
        "exod.daemon.y": ast.parse("if False:\n    import mlx_vlm.utils\n"),
        "exod.runner.z": ast.parse("import mlx.core\n"),  # not reached from the CLI
    }
    assert heavy_imports({"exod.cli.x"}, trees) == ["exod.daemon.y: mlx_vlm"]


def test_mlx_vlm_is_imported_only_by_the_vision_and_embedding_runners() -> None:
    outside = sorted(name for name, tree in sources().items()
                     if "mlx_vlm" in external_imports(tree)
                     and not any(name == home or name.startswith(home + ".")
                                 for home in VLM_HOMES))
    assert outside == []
    for home in VLM_HOMES:
        assert (PACKAGE / home.split(".", 1)[1].replace(".", "/") / "__init__.py").is_file()
