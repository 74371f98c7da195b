"""Model files between cluster peers against a plain copy over the same link (`bench cluster`'s
third figure; `python -m bench.cluster_files` alone).

Two network namespaces joined by a veth pair (tests.netns.TwoHosts; root is needed). Host A runs
a real exod with a cluster key whose hub cache holds a snapshot with a FILE_MIB MiB weights file.
Each round, in host B: the fetcher's own code (exod.hub.from_peers.run, as `python -m exod.hub`
runs it: the signed ask, the manifest, the bytes into the cache's partial file, hashed as they
come, the snapshot recorded) fills an empty cache from A; then a plain copy of the same file
over TCP (A's sendfile to a socket, B writing what it reads to a file, nothing checked). The
figure is the plain copy's time over the peer copy's, the median of interleaved rounds: on the
link shaped to 1 Gbit/s (a wired LAN's speed, tc tbf on A's end), and on the bare veth, whose
speed is the memory's, where hashing SHA-256 on one core is what the peer copy adds.
"""

from __future__ import annotations

import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import PY, REPO, report
from bench.results import Figure

FILE_MIB = 200
ROUNDS = 3
PLAIN_PORT = 52499
LAN_RATE = "1gbit"
KEY = "0123456789abcdef" * 4


# ---- the two ends, each run in its host's namespace ---------------------------------------------
def peer_client(host: str, port: int, key_file: str, cache: str) -> None:
    """Fill `cache` with org/bench from the exod at host:port; prints the seconds it took."""
    from exod.core.file_peers import PeerSource
    from exod.core.hub_ref import make
    from exod.hub import from_peers
    from exod.hub.fetch import FetchJob
    from exod.secret_file import KEY_BYTES, read_secret

    class Quiet:
        def send(self, msg: object) -> None:
            pass

    key = read_secret(Path(key_file), KEY_BYTES)
    job = FetchJob(make("org/bench", "main"), Path(cache), False, False, None,
                   Quiet(), (PeerSource("a", "host-a", host, port),), key)  # type: ignore[arg-type]
    t = time.perf_counter()
    got = from_peers.run(job)
    took = time.perf_counter() - t
    assert got is not None, "the peer gave nothing"
    print(f"{took:.6f}", flush=True)


def plain_server(host: str, port: int, path: str, times: int) -> None:
    """Send `path` whole to each of `times` connections (sendfile), then exit."""
    with socket.create_server((host, port)) as srv:
        print("ready", flush=True)
        for _ in range(times):
            conn, _ = srv.accept()
            with conn, open(path, "rb") as f:
                conn.sendfile(f)


def plain_client(host: str, port: int, out: str) -> None:
    """Read what host:port sends into `out`; prints the seconds it took."""
    t = time.perf_counter()
    with socket.create_connection((host, port)) as s, open(out, "wb") as f:
        while chunk := s.recv(1 << 20):
            f.write(chunk)
    print(f"{time.perf_counter() - t:.6f}", flush=True)


# ---- the run ----------------------------------------------------------------------------------
def _in(prefix: list[str], *args: str) -> float:
    res = subprocess.run([*prefix, PY, "-m", "bench.cluster_files", *args], capture_output=True,
                         text=True, check=True, cwd=REPO, timeout=600)
    return float(res.stdout.strip().splitlines()[-1])


def _shape(netns: str, veth: str, rate: str | None) -> None:
    from tests.netns import ip

    if rate is None:
        ip("netns", "exec", netns, "tc", "qdisc", "del", "dev", veth, "root", check=False)
    else:
        ip("netns", "exec", netns, "tc", "qdisc", "add", "dev", veth, "root", "tbf", "rate",
           rate, "burst", "1mb", "latency", "50ms")


def peer_copy() -> list[Figure]:
    """The figures: peer copy against plain copy, on a 1 Gbit/s link and on the bare veth."""
    from tests.harness import Daemon
    from tests.netns import TwoHosts
    from tests.peer_cache import fill

    work = Path(tempfile.mkdtemp(prefix="bench-peer-"))
    key = work / "cluster.key"
    key.write_text(KEY)
    key.chmod(0o600)
    snap = fill(work / "cache-a", "org/bench", {"model.safetensors": os.urandom(FILE_MIB << 20),
                                                "config.json": b'{"model_type": "llama"}\n'})
    weights = str(snap / "model.safetensors")
    figures: list[Figure] = []
    with TwoHosts() as hosts:
        a = Daemon({"node": {"name": "host-a"}, "api": {"listen": ""},
                    "hub": {"cache": str(work / "cache-a")},
                    "cluster": {"key_file": str(key), "mdns": False}}, name="bench-peer")
        try:
            a.start(prefix=tuple(hosts.a.prefix()))
            for label, rate in (("1 Gbit/s link", LAN_RATE), ("bare veth", None)):
                _shape(hosts.a.netns, hosts.a.veth, rate)
                try:
                    figures.append(_rounds(label, hosts, key, weights, work, rate is not None))
                finally:
                    _shape(hosts.a.netns, hosts.a.veth, None)
        finally:
            a.close()
    shutil.rmtree(work, ignore_errors=True)
    return figures


def _rounds(label: str, hosts: object, key: Path, weights: str, work: Path,
            goal: bool) -> Figure:
    from tests.netns import TwoHosts

    assert isinstance(hosts, TwoHosts)
    server = subprocess.Popen([*hosts.a.prefix(), PY, "-m", "bench.cluster_files", "plain-server",
                               hosts.a.address, str(PLAIN_PORT), weights, str(ROUNDS)],
                              stdout=subprocess.PIPE, text=True, cwd=REPO)
    peer: list[float] = []
    plain: list[float] = []
    try:
        assert server.stdout is not None and server.stdout.readline() == "ready\n"
        for _ in range(ROUNDS):
            cache = work / "cache-b"
            shutil.rmtree(cache, ignore_errors=True)
            peer.append(_in(hosts.b.prefix(), "peer", hosts.a.address, "52416", str(key),
                            str(cache)))
            shutil.rmtree(cache, ignore_errors=True)
            plain.append(_in(hosts.b.prefix(), "plain-client", hosts.a.address,
                             str(PLAIN_PORT), str(work / "plain.out")))
            os.unlink(work / "plain.out")
    finally:
        server.wait(60)
    ratios = [p / q for p, q in zip(plain, peer, strict=True)]
    mib = FILE_MIB
    return Figure(f"peer copy of {mib} MiB vs a plain copy, {label}",
                  statistics.median(ratios), rounds=ratios,
                  goal=">= 0.9x" if goal else None,
                  sides={"peer MiB/s": mib / statistics.median(peer),
                         "plain MiB/s": mib / statistics.median(plain)}, side_unit="MiB/s")


def main() -> None:
    report(f"cluster: model files from a peer against a plain copy ({FILE_MIB} MiB, "
           f"{ROUNDS} interleaved rounds, two network namespaces on one veth pair)", peer_copy())


if __name__ == "__main__":
    args = sys.argv[1:]
    if not args:
        from bench import results

        with results.run("cluster_files"):
            main()
    elif args[0] == "peer":
        peer_client(args[1], int(args[2]), args[3], args[4])
    elif args[0] == "plain-server":
        plain_server(args[1], int(args[2]), args[3], int(args[4]))
    elif args[0] == "plain-client":
        plain_client(args[1], int(args[2]), args[3])
