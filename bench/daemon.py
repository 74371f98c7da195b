"""The daemon with 8 ready instances of a real (tiny) model: SIGTERM → exit time, signals sent
to runners, the daemon's own RSS (and that it never maps mlx), and `exoctl status` wall time.

Goals: stop ≤ 1 s with no signal sent to any runner; daemon RSS ≤ 60 MB; status ≤ 0.3 s.
Baselines in the same run: a bare `python -c pass` for process start, and the RSS of a bare
interpreter, so the ratios say what exod itself adds.
"""

from __future__ import annotations

import subprocess
import time

from bench.common import PY, median, model, report, verdict
from exod.daemon.procinfo import rss_bytes
from tests.harness import EXOCTL, Daemon

N = 8


def rss_mb(pid: int) -> float:
    rss = rss_bytes(pid)
    if rss is None:
        raise RuntimeError(f"pid {pid} is gone")
    return rss / 2**20


def maps_mlx(pid: int) -> bool:
    with open(f"/proc/{pid}/maps") as f:
        return "mlx" in f.read()


def bare_python_rss() -> float:
    p = subprocess.Popen([PY, "-c", "import sys; print(flush=True); sys.stdin.read()"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert p.stdout is not None
        p.stdout.readline()  # the interpreter is up
        return rss_mb(p.pid)
    finally:
        p.communicate(b"")


def main(rounds: int = 2) -> None:
    path = model("tiny-4")
    instances = {f"m{i}": {"model": str(path)} for i in range(N)}
    stops, status_times, rss, signals = [], [], [], []
    mlx_mapped = False
    for _ in range(rounds):
        d = Daemon({"ready": "instances", "instances": instances}, name="bench")
        try:
            d.start()  # READY=1 = all 8 ready
            pid = d.proc.pid
            rss.append(rss_mb(pid))
            mlx_mapped |= maps_mlx(pid)
            for _ in range(10):
                t = time.perf_counter()
                subprocess.run([*EXOCTL, "--socket", str(d.socket), "status"], check=True,
                               capture_output=True)
                status_times.append(time.perf_counter() - t)
            t = time.perf_counter()
            code = d.terminate()
            stops.append(time.perf_counter() - t)
            assert code == 0
            signals += [e["extra"]["step"] for e in d.events(event="ladder")
                        if e["extra"]["step"] != "ask"]
        finally:
            d.close()
    base = []
    for _ in range(10):
        t = time.perf_counter()
        subprocess.run([PY, "-c", "pass"], check=True)
        base.append(time.perf_counter() - t)
    s, st, b = median(stops), median(status_times), median(base)
    r, br = max(rss), bare_python_rss()
    report(f"daemon with {N} ready instances (tiny real model), {rounds} rounds", [
        ("SIGTERM → daemon exit", f"{s:.3f} s  (goal ≤ 1 s) {verdict(s <= 1.0)}"),
        ("signals sent to runners", f"{len(signals)} {signals or ''} (goal 0) "
                                    f"{verdict(not signals)}"),
        ("daemon RSS", f"{r:.1f} MB = {r / br:.2f}x a bare python ({br:.1f} MB)  "
                       f"(goal ≤ 60 MB) {verdict(r <= 60)}"),
        ("daemon maps mlx", f"{mlx_mapped} (goal False) {verdict(not mlx_mapped)}"),
        ("exoctl status wall time", f"{st * 1000:.0f} ms = {st / b:.2f}x `python -c pass` "
                                    f"({b * 1000:.0f} ms)  (goal ≤ 300 ms) {verdict(st <= 0.3)}"),
    ])


if __name__ == "__main__":
    main()
