"""Which files of a repository a runner needs, and the disk they take. Pure.

Weights, config, tokenizer and chat template; never code (`*.py`): remote code never runs, so
it is not even fetched. Top-level files only: mlx-lm loads nothing from sub-folders.
"""

from __future__ import annotations

import fnmatch

from exod.config.sizes import format_size

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


def _unit(n: float) -> tuple[float, str]:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return size, unit
    return 1.0, "B"


def _num(x: float) -> str:
    return f"{x:.1f}" if x < 100 else f"{x:.0f}"


def rate_text(rate: float) -> str:
    size, unit = _unit(rate)
    return f"{_num(rate / size)} {unit}/s"


def progress_text(done: int, total: int, rate: float | None, verb: str = "downloading") -> str:
    """e.g. `downloading 1.2 of 4.5 GB (27%, 38 MB/s)`; decimal units, as the hub shows sizes."""
    size, unit = _unit(total)
    pct = int(100 * done / total) if total else 100
    speed = f", {rate_text(rate)}" if rate is not None else ""
    return f"{verb} {_num(done / size)} of {_num(total / size)} {unit} ({pct}%{speed})"
