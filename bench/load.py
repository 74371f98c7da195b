"""Loading: exod's runner (lazy load, then layer by layer with a progress message after each)
against a plain `mlx_lm.load()` + eval of the same ≥1 GB model, each in a fresh process, runs
interleaved; then `exod run` start → instance ready against the same plain load.

Goals: runner ≤ 1.05× plain; exod run → ready ≤ plain + 0.5 s.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path

from bench.common import PY, big_model, median, report
from bench.results import Figure
from exod.wire import messages as m
from exod.wire.ask import ask
from exod.config.schema import Instance
from exod.core.shards import Shard
from exod.daemon.launch import Launcher
from tests.harness import Daemon

PLAIN = """
import time, sys
t0 = time.perf_counter()
import mlx.core as mx
from mlx_lm import load
model, tok = load(sys.argv[1])
mx.eval(model.parameters())
print("loaded", flush=True)
"""


def plain_load(path: Path) -> float:
    t = time.perf_counter()
    subprocess.run([PY, "-c", PLAIN, str(path)], check=True, capture_output=True,
                   env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    return time.perf_counter() - t


def runner_load(path: Path, run_dir: Path) -> float:
    """A runner started as the daemon starts one (its spec on its channel), until it is ready;
    then its channel closes, and it stops."""
    spec = Launcher(run_dir, {}).launch(Instance(name="big", model=path), Shard(0, 1, 0, 0, 0),
                                        1, 1).spec
    t = time.perf_counter()
    ask("exod.runner", spec, {m.Ready.type: m.Ready}, 600,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}, meanwhile=m.FROM_RUNNER)
    return time.perf_counter() - t


def daemon_ready(path: Path) -> float:
    d = Daemon({"ready": "instances", "instances": {"big": {"model": str(path)}}}, name="bench")
    try:
        t = time.perf_counter()
        d.start(wait_ready=True)  # READY=1 under `ready: instances` = the instance is ready
        elapsed = time.perf_counter() - t
        assert d.instance("big")["state"] == "ready"
        d.terminate()
        return elapsed
    finally:
        d.close()


def main(rounds: int = 3) -> None:
    path = big_model()
    size = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    plain_load(path)  # warm the page cache once so every measured run sees the same disk state
    with tempfile.TemporaryDirectory() as tmp:
        plain, runner, daemon = [], [], []
        for _ in range(rounds):
            plain.append(plain_load(path))
            runner.append(runner_load(path, Path(tmp)))
            daemon.append(daemon_ready(path))
    p, r, dm = median(plain), median(runner), median(daemon)
    report(f"load: {size / 1e9:.2f} GB model, median of {rounds} interleaved runs (warm cache)", [
        ("plain mlx_lm.load + eval (fresh process)", f"{p:.2f} s"),
        ("exod runner, layer by layer + progress", f"{r:.2f} s"),
        Figure("ratio runner / plain", r / p, goal="<= 1.05x",
               sides={"runner": r, "plain": p}, side_unit="s"),
        ("exod run → instance ready", f"{dm:.2f} s"),
        Figure("exod run → ready, difference to plain", dm - p, unit="s", goal="<= 0.5 s"),
    ])


if __name__ == "__main__":
    main()
