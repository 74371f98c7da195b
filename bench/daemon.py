"""The daemon with 8 ready instances of a real (tiny) model: SIGTERM → exit time, signals sent
to runners, the daemon's own RSS (and that it never maps mlx), and `exoctl status` wall time.
Also what /metrics and the status page cost: the idle daemon's CPU with the HTTP API (and so
/metrics and the page) against the same daemon without it, and the daemon CPU of one scrape
and of one status page poll.

Goals: stop ≤ 1 s with no signal sent to any runner; daemon RSS ≤ 60 MB; status ≤ 0.3 s;
idle CPU with the API within noise of idle CPU without it.
Baselines in the same run: a bare `python -c pass` for process start, the RSS of a bare
interpreter, and an API-less daemon's idle CPU, so the ratios say what exod itself adds.
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request

from bench.common import PY, median, model, report
from bench.results import Figure
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


IDLE_WINDOW = 10.0  # seconds of an idle daemon per CPU figure
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of `pid` itself (not its runners)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def idle_cpu_ms(pid: int) -> float:
    """Daemon CPU over IDLE_WINDOW seconds in which nobody asks it anything."""
    before = cpu_s(pid)
    time.sleep(IDLE_WINDOW)  # the measurement itself: a window of idleness
    return (cpu_s(pid) - before) * 1000


def cpu_per_request_ms(pid: int, url: str, n: int = 50) -> float:
    before = cpu_s(pid)
    for _ in range(n):
        with urllib.request.urlopen(url, timeout=30) as r:
            r.read()
    return (cpu_s(pid) - before) * 1000 / n


def api_costs(instances: dict[str, dict[str, str]]) -> list[Figure]:
    """Idle CPU with and without the HTTP API, and the CPU of a scrape and of a page poll."""
    with_api = Daemon({"ready": "instances", "instances": instances}, name="bench")
    without = Daemon({"ready": "instances", "api": {"listen": ""}, "instances": instances},
                     name="bench")
    try:
        with_api.start()
        without.start()
        pid, base_pid, url = with_api.proc.pid, without.proc.pid, with_api.api_url()
        urllib.request.urlopen(url + "/metrics", timeout=30).read()  # imports, first use
        idle, base = idle_cpu_ms(pid), idle_cpu_ms(base_pid)
        scrape = cpu_per_request_ms(pid, url + "/metrics")
        poll = cpu_per_request_ms(pid, url + "/status.json")
    finally:
        with_api.close()
        without.close()
    ratio = idle / base if base else float("inf") if idle else 1.0
    return [
        Figure("idle CPU, API on / off (/metrics, page)", ratio,
               sides={"API on": idle, "API off": base}, side_unit=f"ms per {IDLE_WINDOW:g} s",
               goal="<= 1.5x or <= 20 ms apart", met=ratio <= 1.5 or abs(idle - base) <= 20),
        Figure("one /metrics scrape, daemon CPU", scrape, unit="ms", text="8 instances"),
        Figure("one status page poll, daemon CPU", poll, unit="ms",
               text=f"/status.json, once a second while a page is open = {poll / 10:.2f}% "
                    f"of a core"),
    ]


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
    costs = api_costs(instances)
    report(f"daemon with {N} ready instances (tiny real model), {rounds} rounds", [*costs,
        Figure("SIGTERM → daemon exit", s, unit="s", goal="<= 1 s"),
        Figure("signals sent to runners", len(signals), unit="", text=str(signals or ""),
               goal="== 0"),
        Figure("daemon RSS", r, unit="MB", text=f"{r / br:.2f}x a bare python ({br:.1f} MB)",
               goal="<= 60 MB"),
        Figure("daemon maps mlx", float(mlx_mapped), unit="", text=str(mlx_mapped),
               goal="== 0", met=not mlx_mapped),
        Figure("exoctl status wall time", st * 1000, unit="ms",
               text=f"{st / b:.2f}x `python -c pass` ({b * 1000:.0f} ms)", goal="<= 300 ms"),
    ])


if __name__ == "__main__":
    main()
