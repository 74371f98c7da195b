"""Developers' tools for the soak (bench.soak, `EXOD_SOAK_TRACE`): the daemon under tracemalloc,
or its objects counted by type, snapshotted at SIGUSR1 (after warm-up) and SIGUSR2 (the end)."""

from __future__ import annotations

import json
import signal
import textwrap
from pathlib import Path

from bench.common import REPO

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


def traced_env(folder: Path, types: bool) -> dict[str, str]:
    (folder / "sitecustomize.py").write_text(COUNTER if types else TRACER)
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
