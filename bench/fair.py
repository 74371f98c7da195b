"""Fair shares of the batch (docs/design/fair-share.md), ratios in one run.

The runner's batch engine, width 8, on a generated 4-layer model, driven in a process of its own
as the serve loop drives it (bench.fair_side: clients are closed loops; a time is the median of
7 chats' wall seconds from admission to the first text, at other points of the others' answers):
- key A keeps the batch full (16 streaming clients: 8 in the batch, 8 waiting), key B sends one
  chat: B's time to first token against the floor, B beside A's running streams with nothing
  queued ahead (A's 8 clients only: B waits for the first row A frees, as with any engine that
  never stops an interactive stream): goal <= 1.5x; first come first served (`fair=False`, the
  engine exod had) and B alone beside it;
- weights 3 and 1, 16 clients each: the tokens through the model (prompts and answers) of the
  requests ended in 1,500 steps once settled split 3:1 +- 10 %;
- a `batch` key's 16 clients saturating: an interactive chat's first token against the same
  chat alone, goal <= 1.3x; first come first served beside it.
The key check's cost, through a daemon: bench.fair_keys (also run on its own).
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

from bench.common import PY, REPO, model, report
from bench.fair_keys import key_cost
from bench.results import Figure, note

FLOOR_GOAL = 1.5
BATCH_GOAL = 1.3
SPLIT, SPLIT_TOLERANCE = 3.0, 0.10


def measure() -> dict[str, Any]:
    path = model("prefix-4x256", layers=4, hidden=256, intermediate=768, heads=4, kv_heads=2)
    out = subprocess.run([PY, "-m", "bench.fair_side", str(path)], cwd=REPO, check=True,
                         capture_output=True, text=True, timeout=3600).stdout
    got: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return got


def figures(got: dict[str, Any]) -> list[Figure]:
    t, med = got["ttft"], got["medians"]
    floor, alone = med["floor"], med["alone"]
    split = got["split"]["three"] / got["split"]["one"]
    return [
        Figure("one chat's first token beside a key's 16 streams / the floor",
               med["fair"] / floor, rounds=[x / floor for x in t["fair"]],
               goal=f"<= {FLOOR_GOAL}x", side_unit="s",
               sides={"fair": med["fair"], "first come first served": med["fcfs"],
                      "floor": floor, "alone": alone},
               text=f"first come first served {med['fcfs'] / floor:.1f}x the floor "
                    f"({med['fcfs'] / alone:.0f}x alone); the floor {floor / alone:.1f}x "
                    "alone"),
        Figure("one chat's first token beside a key's 16 streams / the floor, first come "
               "first served", med["fcfs"] / floor, rounds=[x / floor for x in t["fcfs"]]),
        Figure("tokens served, weights 3:1", split, goal=f"3 +- {SPLIT_TOLERANCE:.0%}",
               met=abs(split / SPLIT - 1) <= SPLIT_TOLERANCE, unit=":1",
               text=f"{got['split']['three']:.0f} and {got['split']['one']:.0f} tokens"),
        Figure("an interactive first token beside a saturating batch key / alone",
               med["beside_batch"] / alone, rounds=[x / alone for x in t["beside_batch"]],
               goal=f"<= {BATCH_GOAL}x", side_unit="s",
               sides={"beside the batch key": med["beside_batch"],
                      "first come first served": med["beside_batch_fcfs"], "alone": alone},
               text=f"first come first served {med['beside_batch_fcfs'] / alone:.0f}x alone"),
    ]


def main() -> None:
    rows: list[Figure] = figures(measure())
    rows += key_cost()  # through a daemon (bench.fair_keys)
    note("the runner's engine in process (bench.fair_side), width 8, a generated 4-layer model; "
         "each time the median of 7 chats")
    report("fair: shares of the batch between keys", rows)


if __name__ == "__main__":
    main()
