"""Which files of a repository a runner needs, and the disk they take. Pure.

Weights, config, tokenizer and chat template; never code (`*.py`): remote code never runs, so
it is not even fetched. Top-level files only: mlx-lm loads nothing from sub-folders.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping

from exod.core.sizes import format_size

WANTED = ("*.safetensors", "*.json", "*.jinja", "tokenizer.model", "tiktoken.model",
          "*.tiktoken", "*.txt", "*.jsonl")


def wanted(path: str) -> bool:
    return "/" not in path and any(fnmatch.fnmatchcase(path, p) for p in WANTED)


def disk_problem(name: str, need: int, free: int, where: str) -> str | None:
    """Refused with the figures, as memory admission refuses: None when it fits."""
    if need <= free:
        return None
    return (f"not enough disk space for {name}: {format_size(need)} still to download, "
            f"{format_size(free)} free on {where}")


def progress_text(done: int, total: int, rate: float | None, verb: str = "downloading") -> str:
    """e.g. `downloading 1.2GiB of 4.5GiB (27%, 38MiB/s)`."""
    pct = int(100 * done / total) if total else 100
    speed = f", {format_size(rate)}/s" if rate is not None else ""
    return f"{verb} {format_size(done)} of {format_size(total)} ({pct}%{speed})"


def servable(path: str) -> bool:
    """A name a peer may ask for: one file a runner needs, at the top of the snapshot (no
    folder, so no `..`). The manifest must list it too."""
    return wanted(path) and path not in (".", "..") and "\\" not in path and "\0" not in path


def layer_files(weight_map: Mapping[str, str], start: int, end: int) -> set[str]:
    """The weight files (a `model.safetensors.index.json`'s `weight_map`: tensor → file) that
    layers `start` to `end` (exclusive) need, and those of every tensor outside the layers
    (embeddings, norm, head): a rank holding any layers loads those too where it needs them."""
    out = set()
    for tensor, file in weight_map.items():
        layer = _layer_of(tensor)
        if layer is None or start <= layer < end:
            out.add(file)
    return out


def _layer_of(tensor: str) -> int | None:
    """`model.layers.12.mlp.up_proj.weight` → 12; None for a tensor of no layer."""
    parts = tensor.split(".")
    for i, part in enumerate(parts[:-1]):
        if part in ("layers", "h", "blocks") and parts[i + 1].isdigit():
            return int(parts[i + 1])
    return None
