"""`bench fair`'s measuring side, run in a process of its own (it imports mlx; bench.fair reads
its one JSON line): the runner's batch engine (exod.runner.serving.batch_engine) driven as the
serve loop drives it, requests admitted between steps, on a generated model.

Clients are closed loops: each keeps one request in the engine and sends the next as the last
ends. Times to first token are wall seconds from a request's admission to its first text.
`python -m bench.fair_side MODEL` prints {"ttft": {...}, "split": {...}}.
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from exod.core.shards import Shard
from exod.runner.cpu import blas

blas.preload()  # before mlx, as in the runner
from exod.facts.model_dir import model_layer_count  # noqa: E402
from exod.runner.cpu import fused  # noqa: E402
from exod.runner.serving.batch_engine import BatchEngine  # noqa: E402
from exod.runner.text.load import load_shard  # noqa: E402
from exod.wire import messages as m  # noqa: E402

WIDTH = 8
CLIENTS = 16  # a key's streaming clients: the batch full, as many waiting
SAMPLES = 7  # first tokens timed in each case (the median is its figure)
EOS = 2  # the generated models' end token, banned: every answer is max_tokens long
LENGTHS = [24, 40, 56, 32, 48, 64, 28, 44]  # a client's answers, cycled: their ends spread
ids = itertools.count()


def ask(key: str, tokens: int, weight: float = 1.0,
        priority: Literal["interactive", "batch"] = "interactive") -> m.Generate:
    n = next(ids)
    text = " ".join(f"Request {n} of {key} asks about line {n * 7 + w}." for w in range(6))
    return m.Generate(id=f"{key}-{n}", kind="completion", prompt=text, max_tokens=tokens,
                      temperature=0, logit_bias={str(EOS): -100}, key=key, weight=weight,
                      priority=priority)


@dataclass
class Load:
    """A key's clients: `clients` closed loops."""

    key: str
    clients: int
    weight: float = 1.0
    priority: Literal["interactive", "batch"] = "interactive"
    lengths: list[int] = field(default_factory=lambda: LENGTHS)
    _lengths: Iterator[int] = field(init=False)

    def __post_init__(self) -> None:
        self._lengths = itertools.cycle(self.lengths)

    def next(self) -> m.Generate:
        return ask(self.key, next(self._lengths), self.weight, self.priority)


class Drive:
    """An engine and the loads on it, stepped as the serve loop steps it."""

    def __init__(self, loaded: Any, loads: list[Load], fair: bool = True) -> None:
        self.e = BatchEngine(loaded.model, loaded.tokenizer, width=WIDTH, cache_bytes=0,
                             prefill_step=256, fair=fair)
        self.loads = {ld.key: ld for ld in loads}
        self.owner: dict[str, str] = {}  # request -> key
        self.first: dict[str, float] = {}  # request -> when its first text came
        self.done: dict[str, tuple[str, int]] = {}  # request -> (key, tokens through the model)
        for ld in loads:
            for _ in range(ld.clients):
                self.send(ld.next())

    def send(self, req: m.Generate) -> float:
        self.owner[req.id] = req.key
        t = time.perf_counter()
        self.e.admit(req)
        return t

    def step(self) -> None:
        for ev in self.e.step():
            assert not isinstance(ev, m.Error), ev
            if isinstance(ev, m.Text) and ev.id not in self.first:
                self.first[ev.id] = time.perf_counter()
            elif isinstance(ev, m.Done):
                key = self.owner.pop(ev.id)
                self.done[ev.id] = (key, ev.prompt_tokens + ev.completion_tokens)
                if key in self.loads:  # a loop sends its next
                    self.send(self.loads[key].next())

    def steps(self, n: int) -> None:
        for _ in range(n):
            self.step()

    def first_token(self, req: m.Generate) -> float:
        """Seconds from `req`'s admission to its first text; stepped on until it is done."""
        t = self.send(req)
        while req.id not in self.done:
            self.step()
        return self.first[req.id] - t


def ttft(loaded: Any, loads: list[Load], fair: bool = True, tokens: int = 8) -> list[float]:
    """One chat's time to first token, SAMPLES times, beside `loads` (settled first)."""
    d = Drive(loaded, loads, fair)
    d.steps(80)
    got = []
    for k in range(SAMPLES):
        got.append(d.first_token(ask("one-chat", tokens)))
        d.steps(3 + 5 * k % 11)  # at another point of the others' answers
    return got


def split(loaded: Any, steps: int = 1500) -> dict[str, float]:
    """Tokens through the model for two saturating keys of weights 3 and 1, over `steps`
    steps once settled (the requests that ended in them)."""
    d = Drive(loaded, [Load("three", CLIENTS, weight=3.0), Load("one", CLIENTS, weight=1.0)])
    d.steps(200)
    d.done.clear()
    d.steps(steps)
    served = {"three": 0, "one": 0}
    for key, n in d.done.values():
        served[key] += n
    return {k: float(v) for k, v in served.items()}


def main() -> None:
    path = Path(sys.argv[1])
    n = model_layer_count(path) or 0
    fused.install()
    loaded = load_shard(path, Shard(0, 1, 0, n, n), progress=lambda i, n: None,
                        should_stop=lambda: False)
    ttft(loaded, [Load("warm", 4)])  # mlx's kernels built before anything is timed
    out: dict[str, Any] = {"ttft": {}, "split": split(loaded)}
    t = out["ttft"]
    t["alone"] = ttft(loaded, [])
    t["floor"] = ttft(loaded, [Load("a", WIDTH)])  # A's running streams, nobody waiting
    t["fair"] = ttft(loaded, [Load("a", CLIENTS)])
    t["fcfs"] = ttft(loaded, [Load("a", CLIENTS)], fair=False)
    night = [64, 96, 128, 80]
    t["beside_batch"] = ttft(loaded, [Load("night", CLIENTS, priority="batch", lengths=night)])
    t["beside_batch_fcfs"] = ttft(
        loaded, [Load("night", CLIENTS, priority="batch", lengths=night)], fair=False)
    out["medians"] = {k: statistics.median(v) for k, v in t.items()}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
