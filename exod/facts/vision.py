"""Which runner serves a model: the vision runner (exod.runner.vision, on mlx-vlm, the optional
extra `exod[vision]`) for a model that sees, mlx-lm's for the rest; told by the model's own
files, never by a list of names: a `vision_config` in config.json, or a model type that the
installed mlx-vlm has a module for and mlx-lm has not.

Reads files only: the daemon and the CLI never import mlx-vlm (nor mlx-lm), and the installed
packages are looked up by where they lie, not imported.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
from pathlib import Path

from exod.facts.extra import INSTALL, have_extra
from exod.facts.model_dir import config_json
from exod.core.memory import Tower



def sees(model_dir: Path) -> str | None:
    """Why `model_dir` is a model that sees (served by the vision runner), or None."""
    from exod.facts.embed import encoding  # which imports this module

    data = config_json(model_dir)
    if data is None or encoding(model_dir) is not None:  # an encoder: exod.runner.embed's
        return None
    vision = data.get("vision_config")
    if isinstance(vision, dict) and vision:
        return "its config.json has a vision_config"
    kind = data.get("model_type")
    vlm = _package_dir("mlx_vlm")
    if isinstance(kind, str) and NAME.fullmatch(kind) and vlm is not None \
            and (vlm / "models" / kind).is_dir() and not _mlx_lm_serves(kind):
        return f"mlx-vlm serves its model type {kind!r} and mlx-lm does not"
    return None


def tower(model_dir: Path) -> Tower | None:
    """A model that sees: its tower's width, the patches of the largest picture it sees at once
    (a fixed `image_size`, else the processor's `max_pixels`, else that of a 1024 x 1024
    picture), and the pixels of the largest picture its processor makes (a tiling processor's
    whole, before its tiles: SmolVLM's `longest_edge`); None for a model that does not see."""
    if sees(model_dir) is None:
        return None
    data = config_json(model_dir) or {}
    vision = data.get("vision_config")
    vision = vision if isinstance(vision, dict) else {}
    hidden = _positive(vision.get("hidden_size")) or 1024
    patch = _positive(vision.get("patch_size")) or 14
    side = _positive(vision.get("image_size"))
    pre = config_json(model_dir, "preprocessor_config.json") or {}
    size = pre.get("size")
    size = size if isinstance(size, dict) else {}
    made = max(_positive(size.get("longest_edge")) ** 2, _positive(size.get("shortest_edge")) ** 2,
               _positive(size.get("height")) * _positive(size.get("width")))
    if side:
        return Tower(hidden, (side // patch) ** 2, max(side * side, made))
    pixels = _positive(pre.get("max_pixels")) or _positive(size.get("max_pixels")) \
        or 1024 * 1024
    return Tower(hidden, pixels // patch ** 2, pixels)


def _positive(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def extra_problem(model_dir: Path) -> str | None:
    """The one line that says a model needs the extra and how to get it, when it is missing."""
    why = sees(model_dir)
    if why is None or have_extra():
        return None
    return (f"{model_dir} is a model that sees ({why}): serving it needs the optional extra "
            f"exod[vision] (mlx-vlm), which is not installed: {INSTALL}")


SPLIT_BY_LAYERS = ("a model that sees is split by layers only (parallelism: pipeline): its "
                   "vision tower runs whole on rank 0")


NAME = re.compile(r"[A-Za-z0-9_-]+")  # a model type as a module name, never a path


def _package_dir(package: str) -> Path | None:
    """Where an installed package lies (None when it is not installed); not imported."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _mlx_lm_serves(kind: str) -> bool:
    """mlx-lm has a module for `kind`, directly or through its MODEL_REMAPPING (read from its
    source: qwen2_5_vl is its qwen2_vl, llava its mistral3)."""
    root = _package_dir("mlx_lm")
    if root is None:
        return False
    target = _remapping(root / "utils.py").get(kind, kind)
    return ".." not in target and (root / "models" / f"{target}.py").is_file()


@functools.lru_cache(maxsize=4)
def _remapping(utils: Path) -> dict[str, str]:
    try:
        tree = ast.parse(utils.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name)
                                                and t.id == "MODEL_REMAPPING"
                                                for t in node.targets):
            try:
                found = ast.literal_eval(node.value)
            except ValueError:
                return {}
            return {k: v for k, v in found.items() if isinstance(k, str) and isinstance(v, str)}
    return {}
