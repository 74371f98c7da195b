"""A daemon whose memory stays flat (issue 28): a mixed soak under chaos, measuring the daemon's
resident memory after warm-up.

One daemon serves a tiny tool-template model (its tokens are cheap, so the daemon's own work
dominates) to `CLIENTS` threads that loop over every kind of request exod serves: chat whole and
streamed, forced tool calls, `json_schema`, streamed Messages and Responses, completions,
refusals (400, 404) and clients that leave mid-stream. Meanwhile a chaos thread kills, freezes
(past `hang_after`), restarts and reloads the instance in turn.

The figure: the daemon's RSS (VmRSS, sampled every `SAMPLE` s) at the end over its level just
after warm-up, each the median of a window of samples. Goal: at most 1.02x.

`EXOD_SOAK_MINUTES` (default 60) sets the length, `EXOD_SOAK_WARMUP` (default a sixth of it)
the warm-up, `EXOD_SOAK_CHAOS_EVERY` (default 30 s) the time between two chaos events.
`EXOD_SOAK_TRACE=1` also runs the daemon under tracemalloc and prints the allocation sites
that grew most between the end of warm-up and the end; `EXOD_SOAK_TRACE=types` counts the
daemon's objects by type instead, and what a trim of the heap returns (developers' tools:
they slow the daemon).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import CACHE, PY, REPO, report, verdict
from tests.harness import Daemon

MINUTES = float(os.environ.get("EXOD_SOAK_MINUTES", "60"))
WARMUP = float(os.environ.get("EXOD_SOAK_WARMUP", str(MINUTES / 6)))
TRACE = os.environ.get("EXOD_SOAK_TRACE") == "1"
TYPES = os.environ.get("EXOD_SOAK_TRACE") == "types"  # object counts by type: cheap
CLIENTS = 6
SAMPLE = 5.0  # seconds between RSS samples
WINDOW = 12  # samples per window (a minute)
# Seconds between two chaos events (EXOD_SOAK_CHAOS_EVERY).
CHAOS_EVERY = float(os.environ.get("EXOD_SOAK_CHAOS_EVERY", "30"))
GOAL = 1.02

TOOL = {"type": "function", "function": {
    "name": "add", "description": "Add two numbers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                    "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}
SCHEMA = {"type": "object", "properties": {"tags": {"type": "array", "maxItems": 4,
                                                     "items": {"type": "string",
                                                               "maxLength": 12}}},
          "required": ["tags"], "additionalProperties": False}


def tool_model() -> Path:
    out = CACHE / "soak-tools"
    if not (out / "tokenizer_config.json").exists():
        src = subprocess.run([PY, "-m", "tests.models.tiny", str(CACHE / "soak-base")],
                             capture_output=True, text=True, check=True, cwd=REPO)
        base = Path(src.stdout.strip().splitlines()[-1])
        from tests.models.tiny import with_tool_template
        if out.exists():
            import shutil
            shutil.rmtree(out)
        with_tool_template(base, out)
    return out


# ---- the request mix --------------------------------------------------------------------------
def _user(i: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"Request {i}: tell me about {i % 97} cats."}]


def requests_mix(i: int) -> tuple[str, dict[str, Any], bool]:
    """(path, body, streamed) of the i-th request."""
    kind = i % 10
    base: dict[str, Any] = {"model": "soak", "max_tokens": 24, "temperature": 0.7, "seed": i}
    if kind == 0:
        return "/v1/chat/completions", {**base, "messages": _user(i)}, False
    if kind == 1:
        return "/v1/chat/completions", {**base, "messages": _user(i), "stream": True,
                                        "stream_options": {"include_usage": True}}, True
    if kind == 2:
        return "/v1/chat/completions", {**base, "messages": _user(i), "tools": [TOOL],
                                        "tool_choice": "required", "max_tokens": 64}, False
    if kind == 3:
        return "/v1/chat/completions", {**base, "messages": _user(i), "max_tokens": 64,
                                        "response_format": {"type": "json_schema", "json_schema": {
                                            "name": "t", "schema": SCHEMA}}}, False
    if kind == 4:
        return "/v1/messages", {"model": "soak", "max_tokens": 24, "stream": True,
                                "system": [{"type": "text", "text": "Be brief.",
                                            "cache_control": {"type": "ephemeral"}}],
                                "messages": _user(i)}, True
    if kind == 5:
        return "/v1/responses", {"model": "soak", "max_output_tokens": 24, "stream": True,
                                 "instructions": "Be brief.", "input": f"Question {i}"}, True
    if kind == 6:
        return "/v1/completions", {**base, "prompt": f"Once upon a time {i}"}, False
    if kind == 7:  # a refusal: a field out of range
        return "/v1/chat/completions", {**base, "messages": _user(i), "temperature": 9}, False
    if kind == 8:  # an instance that does not exist
        return "/v1/chat/completions", {**base, "model": f"nobody-{i}", "messages": _user(i)}, \
            False
    return "/v1/chat/completions", {**base, "messages": _user(i), "stream": True,
                                    "max_tokens": 200}, True  # left mid-stream below


class Load:
    def __init__(self, url: str) -> None:
        self.url = url
        self.stop = threading.Event()
        self.done = 0
        self.statuses: dict[int, int] = {}
        self.lock = threading.Lock()

    def client(self, c: int) -> None:
        i = c
        with httpx.Client(base_url=self.url, timeout=120) as http:
            while not self.stop.is_set():
                path, body, streamed = requests_mix(i)
                status = self.one(http, path, body, streamed, leave=i % 10 == 9)
                with self.lock:
                    self.done += 1
                    self.statuses[status] = self.statuses.get(status, 0) + 1
                i += CLIENTS

    def one(self, http: httpx.Client, path: str, body: dict[str, Any], streamed: bool,
            leave: bool) -> int:
        try:
            if not streamed:
                return http.post(path, json=body).status_code
            with http.stream("POST", path, json=body) as r:
                for n, _ in enumerate(r.iter_lines()):
                    if leave and n == 3:
                        break  # the client leaves: the connection closes mid-stream
                return r.status_code
        except httpx.HTTPError:
            return -1


# ---- chaos ------------------------------------------------------------------------------------
def runner_pid(d: Daemon) -> int | None:
    ranks = d.instance("soak").get("ranks") or []
    pid = ranks[0].get("pid") if ranks else None
    return int(pid) if pid else None


def chaos(d: Daemon, stop: threading.Event, counts: dict[str, int]) -> None:
    events = ("kill", "freeze", "restart", "reload")
    n = 0
    while not stop.wait(CHAOS_EVERY):
        what = events[n % len(events)]
        n += 1
        pid = runner_pid(d)
        try:
            if what == "kill" and pid:
                os.kill(pid, signal.SIGKILL)
            elif what == "freeze" and pid:
                os.kill(pid, signal.SIGSTOP)  # hang_after notices; the ladder ends it
            elif what == "restart":
                d.ctl("restart", "soak", check=False, timeout=60)
            elif what == "reload":
                d.write_config(config(max_queue=16 + n % 2))
                d.send_signal(signal.SIGHUP)
        except (ProcessLookupError, OSError):
            pass
        counts[what] = counts.get(what, 0) + 1


def config(max_queue: int = 16) -> dict[str, Any]:
    return {
        "defaults": {"stop": {"grace": "3s", "attempts": 1, "interval": "1s"},
                     "start_limit": {"burst": 1000, "interval": "60s"},
                     "backoff": {"initial": "100ms", "max": "1s"}},
        "instances": {"soak": {"model": str(tool_model()), "max_concurrency": 8,
                               "max_queue": max_queue, "hang_after": "4s", "restart": "always",
                               "env": {"OPENBLAS_NUM_THREADS": "1"}}},
    }


# ---- memory -----------------------------------------------------------------------------------
def mappings(pid: int) -> dict[str, int]:
    """RSS (KiB) by kind of mapping: the main heap, anonymous mappings (other malloc arenas,
    thread stacks, mmapped blocks) and files."""
    out: dict[str, int] = {}
    kind = "?"
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split()
        if len(head) >= 5 and "-" in head[0]:
            name = head[5] if len(head) > 5 else ""
            kind = name if name.startswith("[") else "file" if name else "anon"
        elif head and head[0] == "Rss:":
            out[kind] = out.get(kind, 0) + int(head[1])
    return out


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


TRACER = textwrap.dedent("""
    import sys
    if any(a.endswith("exod") for a in sys.orig_argv[:2]) and "run" in sys.orig_argv:
        import signal, tracemalloc
        tracemalloc.start(12)
        def _dump(sig, frame):
            import os
            path = os.environ["EXOD_SOAK_SNAPSHOT"] + str(sig)
            tracemalloc.take_snapshot().dump(path + ".tmp")
            os.rename(path + ".tmp", path)
        signal.signal(signal.SIGUSR1, _dump)
        signal.signal(signal.SIGUSR2, _dump)
""")


COUNTER = textwrap.dedent("""
    import sys
    if any(a.endswith("exod") for a in sys.orig_argv[:2]) and "run" in sys.orig_argv:
        import signal
        def _count(sig, frame):
            import collections, gc, json, os
            gc.collect()
            counts = collections.Counter(type(o).__qualname__ for o in gc.get_objects())
            def rss():
                for line in open("/proc/self/status"):
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1])
            counts["~rss_before_trim"] = rss()
            import ctypes
            ctypes.CDLL("libc.so.6").malloc_trim(0)
            counts["~rss_after_trim"] = rss()
            path = os.environ["EXOD_SOAK_SNAPSHOT"] + str(sig)
            with open(path + ".tmp", "w") as f:
                json.dump(counts, f)
            os.rename(path + ".tmp", path)
        signal.signal(signal.SIGUSR1, _count)
        signal.signal(signal.SIGUSR2, _count)
""")


def type_growth(folder: Path) -> list[str]:
    first = json.loads((folder / f"snap-{int(signal.SIGUSR1)}").read_text())
    last = json.loads((folder / f"snap-{int(signal.SIGUSR2)}").read_text())
    diff = sorted(((last.get(k, 0) - first.get(k, 0), k) for k in set(first) | set(last)),
                  reverse=True)
    return [f"{d:+d} {k} (now {last.get(k, 0)})" for d, k in diff[:20] if d] + [
        f"objects in all: {sum(first.values())} -> {sum(last.values())}"]


def traced_env(folder: Path) -> dict[str, str]:
    (folder / "sitecustomize.py").write_text(COUNTER if TYPES else TRACER)
    return {"PYTHONPATH": f"{folder}:{REPO}", "EXOD_SOAK_SNAPSHOT": str(folder / "snap-")}


def growth_sites(folder: Path) -> list[str]:
    import tracemalloc
    first = tracemalloc.Snapshot.load(str(folder / f"snap-{int(signal.SIGUSR1)}"))
    last = tracemalloc.Snapshot.load(str(folder / f"snap-{int(signal.SIGUSR2)}"))
    stats = last.compare_to(first, "traceback")[:12]
    out = []
    for s in stats:
        out.append(f"{s.size_diff / 1024:+.0f} KiB ({s.count_diff:+d} blocks)")
        out.extend("    " + line for line in s.traceback.format()[-8:])
    return out


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="soak-"))
    env = traced_env(tmp) if TRACE or TYPES else None
    extra = dict(kv.split("=", 1) for kv in os.environ.get("EXOD_SOAK_ENV", "").split())
    d = Daemon(config(), env={**(env or {}), **extra}, name="bench-soak")
    d.start()
    d.until_state("soak", "ready")
    assert d.proc is not None
    pid = d.proc.pid
    load = Load(d.api_url())
    threads = [threading.Thread(target=load.client, args=(c,), daemon=True)
               for c in range(CLIENTS)]
    counts: dict[str, int] = {}
    chaos_thread = threading.Thread(target=chaos, args=(d, load.stop, counts), daemon=True)
    samples: list[tuple[float, int]] = []
    t0 = time.monotonic()
    try:
        for t in threads:
            t.start()
        chaos_thread.start()
        traced_first = False
        maps_warm: dict[str, int] = {}
        while (elapsed := time.monotonic() - t0) < MINUTES * 60:
            samples.append((elapsed, rss_kib(pid)))
            if not maps_warm and elapsed >= WARMUP * 60:
                maps_warm = mappings(pid)
            if (TRACE or TYPES) and not traced_first and elapsed >= WARMUP * 60:
                os.kill(pid, signal.SIGUSR1)
                traced_first = True
            time.sleep(SAMPLE)  # a sampling period, not a synchronisation
        maps_end = mappings(pid)
        if TRACE or TYPES:
            os.kill(pid, signal.SIGUSR2)
            written = tmp / f"snap-{int(signal.SIGUSR2)}"
            deadline = time.monotonic() + 120
            while not written.exists() and time.monotonic() < deadline:
                time.sleep(0.1)  # polling for the file the daemon renames into place
    finally:
        load.stop.set()
        for t in threads:
            t.join(130)
        rows_sites = growth_sites(tmp) if TRACE else type_growth(tmp) if TYPES else []
        d.close()
    after_warm = [r for t, r in samples if t >= WARMUP * 60][:WINDOW]
    last = [r for _, r in samples][-WINDOW:]
    base, end = statistics.median(after_warm), statistics.median(last)
    ratio = end / base
    series = " ".join(f"{int(t // 60)}m:{r // 1024}" for t, r in samples[::WINDOW])
    report("soak: the daemon's memory under a mixed load with chaos", [
        ("length, warm-up", f"{MINUTES:g} min, {WARMUP:g} min"),
        ("requests", f"{load.done} ({json.dumps(dict(sorted(load.statuses.items())))})"),
        ("chaos events", json.dumps(counts)),
        ("RSS after warm-up, at the end", f"{base / 1024:.1f} MiB, {end / 1024:.1f} MiB"),
        ("RSS per minute (MiB)", series),
        ("RSS by mapping, after warm-up -> end (KiB)",
         ", ".join(f"{k} {maps_warm.get(k, 0)}->{v}" for k, v in sorted(maps_end.items()))),
        ("growth end / after warm-up", f"{ratio:.3f}x (goal <= {GOAL}x) "
                                       f"{verdict(ratio <= GOAL)}"),
    ])
    if rows_sites:
        print("\n== allocation sites that grew most (tracemalloc)")
        print("\n".join(rows_sites))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
