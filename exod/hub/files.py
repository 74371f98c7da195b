"""Which files of a repository a runner needs, and the disk they take. Pure.

Weights, config, tokenizer and chat template; never code (`*.py`): remote code never runs, so
it is not even fetched. Top-level files only: mlx-lm loads nothing from sub-folders.
"""

from __future__ import annotations

import fnmatch

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
