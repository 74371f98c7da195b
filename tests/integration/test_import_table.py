"""exod.runner.start.import_table with the real transformers, each start in a process of its own
(the suite's process never imports transformers): a runner's cached import table gives transformers
exactly the names it finds by reading its sources, and it truly is read from the cache."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from exod.runner.start import import_table

START = """
import json, sys
from pathlib import Path
from exod.runner.start import import_table
if sys.argv[1] != "-":
    assert import_table.install(Path(sys.argv[1]))
import transformers
import transformers.models
from transformers import AutoTokenizer, PreTrainedTokenizerFast  # what mlx_lm takes
print(json.dumps({"top": sorted(dir(transformers)), "models": sorted(dir(transformers.models))}))
"""


def start(cache: Path | None) -> dict[str, list[str]]:
    proc = subprocess.run([sys.executable, "-c", START, str(cache) if cache else "-"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    names: dict[str, list[str]] = json.loads(proc.stdout.strip().splitlines()[-1])
    return names


def test_the_cached_table_is_the_one_transformers_builds(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    plain = start(None)
    assert len(plain["top"]) > 1000 and "AutoTokenizer" in plain["top"]
    assert start(cache) == plain  # built and written
    assert list(cache.glob("*.json"))
    assert start(cache) == plain  # read back


def test_a_start_reads_the_table_from_the_cache(tmp_path: Path) -> None:
    """A name planted in the cached tables shows in transformers: they were read, not built."""
    cache = tmp_path / "cache"
    start(cache)
    for file in cache.glob("*.json"):
        table = import_table.decode(json.loads(file.read_text()))
        assert table is not None
        table.setdefault(frozenset(), {}).setdefault("exod_planted", set()).add("ExodPlanted")
        file.write_text(json.dumps(import_table.encode(table)))
    names = start(cache)
    assert "ExodPlanted" in names["models"]
