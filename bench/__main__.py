"""`python -m bench [NAME ...]`: run the benchmarks (all by default), print their ratios, and
append each run's figures to bench/results/NAME.jsonl (bench.results)."""

from __future__ import annotations

import importlib
import sys

from bench import results

# agent runs agent_constrained too
ALL = ["load", "daemon", "api", "serving", "fused", "sharding", "families", "systemd", "security",
       "hostile_runner", "hostile_reads", "ports", "group_start", "runner_start", "jit_header",
       "jit_flags", "models", "agent", "vision", "embeddings", "ollama", "cache", "agent_cache",
       "split", "prefix", "kv", "fair", "cluster"]


# Not in ALL: an hour long by default (EXOD_SOAK_MINUTES); run it by name.
LONG = ["soak"]


def main() -> None:
    names = [a for a in sys.argv[1:] if not a.startswith("-")] or ALL
    for name in names:
        with results.run(name):
            importlib.import_module(f"bench.{name}").main()


if __name__ == "__main__":
    main()
