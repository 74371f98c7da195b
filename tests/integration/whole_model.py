"""A model loaded whole in this process, as a one-rank runner loads it: the CPU's fused kernels
installed, every layer in one shard. What the in-process engine checks (*_checks.py, each run in
a pytest of its own since they import mlx) serve from; each calls exod.runner.cpu.blas.preload
before importing this, as the runner does before mlx."""

from __future__ import annotations

from pathlib import Path

from exod.core.shards import Shard
from exod.facts.model_dir import model_layer_count
from exod.runner.cpu import fused
from exod.runner.load import Loaded
from exod.runner.text.load import load_shard


def load_whole(path: Path) -> Loaded:
    n = model_layer_count(path) or 0
    fused.install()  # as the runner serves (the references run on the same kernels)
    return load_shard(path, Shard(0, 1, 0, n, n), progress=lambda i, n: None,
                      should_stop=lambda: False)
