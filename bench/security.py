"""Under attack (issue #11): how much a flood slows the daemon down, against itself unflooded in
the same run. The daemon runs with RLIMIT_NOFILE 1024 (as the audit found it), no model.

1. `/health` latency (p50 of 200 requests) with 1,000 idle, half-sent connections open, over
   the same with none open; and `exoctl status` wall time likewise.
2. The daemon's RSS after 8 clients each announce a 15 MiB body (refused by Content-Length,
   413) and after 8 send a 3 MiB JSON body each (read and parsed), over its RSS before.

Goals: every latency ratio ≤ 2; /health answers throughout; RSS ratio ≤ 1.5.
"""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import threading
import time

from bench.common import median, report
from bench.results import Figure
from bench.daemon import rss_mb
from tests.harness import EXOCTL, Daemon

IDLE = 1000
PROBES = 200


def health_p50(host: str, port: int) -> float:
    times = []
    for _ in range(PROBES):
        t = time.perf_counter()
        conn = http.client.HTTPConnection(host, port, timeout=10)
        conn.request("GET", "/health")
        resp = conn.getresponse()
        resp.read()
        conn.close()
        assert resp.status == 200, resp.status
        times.append(time.perf_counter() - t)
    return median(times)


def status_p50(d: Daemon) -> float:
    times = []
    for _ in range(10):
        t = time.perf_counter()
        subprocess.run([*EXOCTL, "--socket", str(d.socket), "status"], check=True,
                       capture_output=True)
        times.append(time.perf_counter() - t)
    return median(times)


def post(host: str, port: int, body: bytes, announce: int | None = None) -> int:
    with socket.create_connection((host, port), timeout=30) as s:
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
                f"Content-Type: application/json\r\nContent-Length: {announce or len(body)}"
                "\r\nConnection: close\r\n\r\n").encode()
        s.sendall(head)
        try:
            s.sendall(body)
        except OSError:
            pass  # refused before the body was read
        return int(s.recv(65536).split(b" ", 2)[1])


def main() -> None:
    d = Daemon({"instances": {}, "api": {"listen": "127.0.0.1:0"}}, name="bench")
    d.write_config({"control": {"socket": str(d.socket)},
                    "api": {"listen": "127.0.0.1:0", "header_timeout": "5m"}, "instances": {}})
    try:
        d.start(prefix=("prlimit", "--nofile=1024:1024", "--"))
        assert d.proc is not None
        host, port = "127.0.0.1", int(d.api_url().rsplit(":", 1)[1])
        base_health, base_status = health_p50(host, port), status_p50(d)
        idle = []
        for _ in range(IDLE):
            s = socket.create_connection((host, port), timeout=10)
            s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\n")
            idle.append(s)
        flood_health, flood_status = health_p50(host, port), status_p50(d)
        for s in idle:
            s.close()

        rss_before = rss_mb(d.proc.pid)
        big = b"x" * (15 * 2**20)
        statuses: list[int] = []
        threads = [threading.Thread(target=lambda: statuses.append(
            post(host, port, big))) for _ in range(8)]
        doc = json.dumps({"model": "none", "messages": [{"role": "user",
                                                          "content": "y" * (3 * 2**20)}]})
        threads += [threading.Thread(target=lambda: statuses.append(
            post(host, port, doc.encode()))) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        rss_after = rss_mb(d.proc.pid)
    finally:
        d.close()
    h, st, r = flood_health / base_health, flood_status / base_status, rss_after / rss_before
    report("security: a daemon under a flood (RLIMIT_NOFILE 1024)", [
        Figure(f"/health p50, {IDLE} idle connections / none", h, goal="<= 2x",
               sides={"flood": flood_health * 1e3, "none": base_health * 1e3}, side_unit="ms"),
        Figure(f"exoctl status, {IDLE} idle connections / none", st, goal="<= 2x",
               sides={"flood": flood_status * 1e3, "none": base_status * 1e3}, side_unit="ms"),
        Figure("RSS after 8x15 MiB announced + 8x3 MiB parsed / before", r, goal="<= 1.5x",
               sides={"after": rss_after, "before": rss_before}, side_unit="MB",
               text=f"answers {sorted(set(statuses))}"),
    ])


if __name__ == "__main__":
    main()
