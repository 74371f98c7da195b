"""The optional extra `exod[vision]` (mlx-vlm), which the vision runner and the embedding runner
need: whether it is installed (looked up, never imported) and how to install it."""

from __future__ import annotations

import importlib.util

INSTALL = "pip install 'exod[vision]'"


def have_extra() -> bool:
    """Whether mlx-vlm is installed (looked up, not imported)."""
    return importlib.util.find_spec("mlx_vlm") is not None
