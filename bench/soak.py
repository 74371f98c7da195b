"""An hour of every kind of traffic under chaos (issues 28 and 45): nothing lost, nothing grown.

One daemon serves six instances (bench.soak_traffic.Names): tiny tool-template chat models
(`soak` takes runner chaos, `steady` none), two tiny Qwen2.5-VLs that see (`eye` takes runner
chaos, `eye-steady` none; pictures go to each in turn), a BERT that embeds and a reranker.
`CLIENTS` threads loop over every kind of request exod serves: chat whole and streamed, forced
tool calls, `json_schema`, streamed Messages and Responses, completions, Ollama's chat and
generate, pictures as data URLs and fetched from a local picture server on an address the config
allows, embeddings (OpenAI's and Ollama's), rerank, requests that share a long prefix (served
from the disk tier after each restart), refusals (400, 404) and clients that leave mid-stream.
Meanwhile bench.soak_chaos kills and freezes runners, restarts and reloads instances, fills the
prompt cache's disk (a tmpfs: run as root) for a while, and restarts the daemon itself twice, at
a quarter and at half of the run.

The figures:
- requests lost: 0 is the goal (bench.soak_traffic says what counts as lost);
- every instance ready after the chaos stops;
- the daemon's RSS at the end of each of its lives over its level after that life's warm-up
  (each the median of a minute of samples): goal <= 1.02x;
- each instance's runner RSS likewise: goal <= 1.05x. Where runner chaos replaces an
  instance's runner every few minutes (`soak`, `eye`, `vec`), a life's figure compares
  different processes, so there each runner that lived past its own warm-up is measured from
  then to its end; the steady twins' runners live a whole daemon life;
- hits of the prompt cache's disk tier.

`EXOD_SOAK_MINUTES` (default 60) sets the length, `EXOD_SOAK_WARMUP` (default 5, each life's)
the warm-up, `EXOD_SOAK_CHAOS_EVERY` (default 30 s) the time between two chaos events.
`EXOD_SOAK_TRACE=1` also runs the daemon under tracemalloc and prints the allocation sites
that grew most between the end of warm-up and the end of its first life; `EXOD_SOAK_TRACE=types`
counts the daemon's objects by type instead, and what a trim of the heap returns (developers'
tools: they slow the daemon).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from dataclasses import asdict, dataclass
from typing import Any

from bench.common import CACHE, PY, REPO, report, Row
from bench.results import Figure
from bench.soak_chaos import TARGETS, Chaos, Disk
from bench.soak_trace import growth_sites, traced_env, type_growth
from bench.soak_traffic import TIMEOUT, Load, Names, PictureServer
from tests.harness import Daemon, free_port

MINUTES = float(os.environ.get("EXOD_SOAK_MINUTES", "60"))
WARMUP = float(os.environ.get("EXOD_SOAK_WARMUP", "5"))
TRACE = os.environ.get("EXOD_SOAK_TRACE") == "1"
TYPES = os.environ.get("EXOD_SOAK_TRACE") == "types"  # object counts by type: cheap
CLIENTS = 6
SAMPLE = 5.0  # seconds between RSS samples
WINDOW = 12  # samples per window (a minute)
# Seconds between two chaos events (EXOD_SOAK_CHAOS_EVERY).
CHAOS_EVERY = float(os.environ.get("EXOD_SOAK_CHAOS_EVERY", "30"))
GOAL, RUNNER_GOAL = 1.02, 1.05
PICTURE_HOST = "127.0.0.2"  # loopback, refused unless allowed: the config allows it
NAMES = Names()
DISK_MIB = 64  # the prompt cache's tmpfs


def made(module: str, root: Path, *families: str) -> dict[str, dict[str, str]]:
    res = subprocess.run([PY, "-m", module, str(root), *families], capture_output=True,
                         text=True, check=True, cwd=REPO)
    out: dict[str, dict[str, str]] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


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


def png() -> bytes:
    code = ("import io, sys; from tests.models.vision_zoo import picture\n"
            "b = io.BytesIO(); picture(64, 48, seed=5).save(b, 'PNG')\n"
            "sys.stdout.buffer.write(b.getvalue())")
    return subprocess.run([PY, "-c", code], cwd=REPO, check=True, capture_output=True).stdout


class Models:
    def __init__(self) -> None:
        self.tools = str(tool_model())
        self.eye = made("tests.models.vision_zoo", CACHE / "soak-vision",
                        "qwen2_5_vl")["qwen2_5_vl"]["path"]
        embed = made("tests.models.embed_zoo", CACHE / "soak-embed", "bert", "reranker")
        self.vec, self.rank = embed["bert"]["path"], embed["reranker"]["path"]


def config(models: Models, port: int, cache: Path, variant: int = 0) -> dict[str, Any]:
    common = {"restart": "always", "hang_after": "4s", "env": {"OPENBLAS_NUM_THREADS": "1"}}
    return {
        "api": {"listen": f"127.0.0.1:{port}", "image_url_allow": [f"{PICTURE_HOST}/32"]},
        "defaults": {"stop": {"grace": "3s", "attempts": 1, "interval": "1s"},
                     "start_limit": {"burst": 1000, "interval": "60s"},
                     "backoff": {"initial": "100ms", "max": "1s"}},
        "instances": {
            NAMES.chat: {"model": models.tools, "max_concurrency": 8, "max_queue": 16 + variant,
                         "prompt_cache_dir": str(cache), "prompt_cache_bytes": 16 << 20,
                         "prompt_cache_disk_bytes": "12MiB", **common},
            NAMES.steady: {"model": models.tools, "max_concurrency": 8, "max_queue": 16,
                           "prompt_cache_dir": str(cache), "prompt_cache_bytes": 16 << 20,
                           "prompt_cache_disk_bytes": "12MiB", **common},
            # A model that sees keeps its prompt cache in RAM only (docs/vision.md).
            **{name: {"model": models.eye, "max_concurrency": 4, "max_queue": 16,
                      "prompt_cache_bytes": 16 << 20, **common}
               for name in (NAMES.eye, NAMES.steady_eye)},
            NAMES.vec: {"model": models.vec, "max_queue": 16, **common},
            NAMES.rank: {"model": models.rank, "max_queue": 16, **common},
        },
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


@dataclass(frozen=True)
class Sample:
    t: float  # seconds from the start
    life: int  # which of the daemon's lives
    who: str  # "daemon" or an instance's name
    pid: int
    rss: int  # KiB


class Sampler:
    """The daemon's and each ready runner's RSS every `SAMPLE` s, and the disk tier's hits of
    each runner (its counters start again with it)."""

    def __init__(self, d: Daemon, chaos: Chaos, t0: float) -> None:
        self.d, self.chaos, self.t0 = d, chaos, t0
        self.samples: list[Sample] = []
        self.disk_hits: dict[int, int] = {}
        self.maps: dict[str, dict[str, int]] = {}  # the daemon's mappings: "warm", "end"
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(SAMPLE):  # a sampling period, not a synchronisation
            if self.chaos.daemon_lock.locked():
                continue  # the daemon is being restarted
            try:
                self.once(time.monotonic() - self.t0, len(self.chaos.lives) - 1)
            except (OSError, ValueError, IndexError, KeyError, StopIteration, TimeoutError):
                continue  # the daemon went down under the sample

    def once(self, t: float, life: int) -> None:
        assert self.d.proc is not None
        pid = self.d.proc.pid
        self.samples.append(Sample(t, life, "daemon", pid, rss_kib(pid)))
        if life == 0 and "warm" not in self.maps and t >= WARMUP * 60:
            self.maps["warm"] = mappings(pid)
        if life == 0:
            self.maps["end"] = mappings(pid)
        for inst in self.d.status()["instances"]:
            ranks = inst.get("ranks") or []
            if inst["state"] != "ready" or not ranks or not ranks[0].get("pid"):
                continue
            runner = int(ranks[0]["pid"])
            self.samples.append(Sample(t, life, inst["name"], runner, rss_kib(runner)))
            cache = (inst.get("serving") or {}).get("prompt_cache") or {}
            hits = int((cache.get("disk") or {}).get("hits") or 0)
            self.disk_hits[runner] = max(self.disk_hits.get(runner, 0), hits)


def per_process(samples: list[Sample], who: str) -> list[tuple[int, float, float, float]]:
    """(pid, KiB after its own warm-up, KiB at its end, minutes between) of each of `who`'s
    runner processes that lived long enough to hold two windows after its warm-up. For an
    instance whose runner chaos replaces every few minutes: its RSS by life compares different
    processes, each at another point of its own warm-up."""
    out = []
    for pid in dict.fromkeys(s.pid for s in samples if s.who == who):
        mine = [s for s in samples if s.who == who and s.pid == pid]
        after = [s.rss for s in mine if s.t >= mine[0].t + WARMUP * 60]
        if len(after) >= 2 * WINDOW:
            out.append((pid, *_ends(after), (mine[-1].t - mine[0].t) / 60 - WARMUP))
    return out


def _ends(after: list[int]) -> tuple[float, float]:
    """The first and the last window's medians of samples taken after a warm-up."""
    return statistics.median(after[:WINDOW]), statistics.median(after[-WINDOW:])


def growth(samples: list[Sample], lives: list[tuple[float, int]], who: str
           ) -> list[tuple[int, float, float, float]]:
    """(life, KiB after its warm-up, KiB at its end, minutes between) of each life long
    enough to hold two windows after its warm-up."""
    out = []
    for life, (start, _) in enumerate(lives):
        after = [s.rss for s in samples
                 if s.life == life and s.who == who and s.t >= start + WARMUP * 60]
        if len(after) >= 2 * WINDOW:
            span = [s.t for s in samples if s.life == life and s.who == who]
            out.append((life, *_ends(after), (span[-1] - start) / 60 - WARMUP))
    return out


def mount_disk(where: Path) -> Disk | None:
    """The prompt cache's own small filesystem, to fill on cue; None unless run as root."""
    where.mkdir(mode=0o700)
    if os.geteuid() != 0:
        return None
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_MIB}m,mode=0700", "tmpfs",
                    str(where)], check=True)
    return Disk(where)


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="soak-"))
    env = traced_env(tmp, TYPES) if TRACE or TYPES else None
    extra = dict(kv.split("=", 1) for kv in os.environ.get("EXOD_SOAK_ENV", "").split())
    models, port, cache = Models(), free_port(), tmp / "prompt-cache"
    disk = mount_disk(cache)
    pictures = PictureServer(PICTURE_HOST, png())
    data_url = "data:image/png;base64," + base64.b64encode(png()).decode()
    d = Daemon(config(models, port, cache), env={**(env or {}), **extra}, name="bench-soak")
    # Tracing follows one daemon: no daemon restarts then.
    restarts = [] if TRACE or TYPES else [MINUTES * 60 / 4, MINUTES * 60 / 2]
    chaos = Chaos(d, disk, CHAOS_EVERY, restarts, lambda v: {
        "control": {"socket": str(d.socket)}, **config(models, port, cache, v)})
    try:
        d.start()
        for name in asdict(NAMES).values():
            d.until_state(name, "ready", timeout=600)
        load = Load(f"http://127.0.0.1:{port}", NAMES, data_url, pictures.url)
        t0 = time.monotonic()
        sampler = Sampler(d, chaos, t0)
        threads = [threading.Thread(target=load.client, args=(c, CLIENTS), daemon=True)
                   for c in range(CLIENTS)]
        threads += [threading.Thread(target=chaos.run, args=(t0,), daemon=True),
                    threading.Thread(target=sampler.run, daemon=True)]
        for t in threads:
            t.start()
        if TRACE or TYPES:
            chaos.stop.wait(WARMUP * 60)
            assert d.proc is not None
            d.proc.send_signal(signal.SIGUSR1)
        chaos.stop.wait(max(0.0, MINUTES * 60 - (time.monotonic() - t0)))  # the run's length
        sites = traced(d, tmp) if TRACE or TYPES else []
        load.stop.set()
        chaos.stop.set()
        sampler.stop.set()
        for t in threads:
            t.join(TIMEOUT + 60)
        ready = after_chaos(d)
    finally:
        if d.log_path.exists():
            shutil.copy(d.log_path, tmp / "exod.log")  # the daemon's folder goes with it
        d.close()
        pictures.close()
        if disk is not None:
            subprocess.run(["umount", "-l", str(cache)], check=False)
    figures(load, chaos, sampler, disk is not None, ready)
    print(f"\nthe daemon's log: {tmp / 'exod.log'}")
    if chaos.failed:
        print(f"the chaos thread failed: {chaos.failed}")
    if sites:
        print("\n== allocation sites that grew most (tracemalloc)")
        print("\n".join(sites))
    sys.stdout.flush()


def traced(d: Daemon, tmp: Path) -> list[str]:
    assert d.proc is not None
    d.proc.send_signal(signal.SIGUSR2)
    written = tmp / f"snap-{int(signal.SIGUSR2)}"
    deadline = time.monotonic() + 120
    while not written.exists() and time.monotonic() < deadline:
        time.sleep(0.1)  # polling for the file the daemon renames into place
    return growth_sites(tmp) if TRACE else type_growth(tmp)


def after_chaos(d: Daemon) -> dict[str, str]:
    """Each instance's state once the chaos has stopped: ready, or what it was after 5 min."""
    assert d.proc is not None
    if d.proc.poll() is not None:
        return {"daemon": f"exited with {d.proc.returncode}"}
    out = {}
    for name in asdict(NAMES).values():
        try:
            d.until_state(name, "ready", timeout=300)
            out[name] = "ready"
        except AssertionError:
            out[name] = d.instance(name)["state"]
    return out


def figures(load: Load, chaos: Chaos, sampler: Sampler, full_disk: bool,
            ready: dict[str, str]) -> None:
    tally = load.tally
    rows: list[Row] = [
        ("length, each life's warm-up", f"{MINUTES:g} min, {WARMUP:g} min; {CLIENTS} clients"),
        ("requests", f"{tally.done}: {json.dumps(dict(sorted(tally.outcomes.items())))}; "
                     f"connections refused while the daemon restarted, tried again: "
                     f"{tally.reconnects}"),
        ("by kind", "; ".join(f"{k} {dict(v)}" for k, v in sorted(tally.by_kind.items()))),
        ("refusals' reasons (most common)",
         "; ".join(f"{n}x {r}" for r, n in tally.reasons.most_common(8))),
        Figure("requests lost", tally.outcomes["lost"], unit="", goal="== 0",
               text=f"of {tally.done}"),
        ("chaos events", json.dumps(dict(sorted(chaos.counts.items())))
         + ("" if full_disk else "; no full disk: it needs root (a tmpfs)")),
        ("disk-tier hits (runners that hit / runners seen)",
         f"{sum(sampler.disk_hits.values())} "
         f"({sum(1 for h in sampler.disk_hits.values() if h)}/{len(sampler.disk_hits)})"),
        Figure("every instance ready after", None, text=json.dumps(ready),
               met=all(v == "ready" for v in ready.values())),
    ]
    replaced = {n for names in TARGETS.values() for n in names}  # by runner chaos
    for who, goal in [("daemon", GOAL), *((n, RUNNER_GOAL) for n in asdict(NAMES).values())]:
        lives = growth(sampler.samples, chaos.lives, who)
        said = ", ".join(f"life {li}: {base / 1024:.1f} -> {end / 1024:.1f} MiB over "
                         f"{mins:.0f} min" for li, base, end, mins in lives)
        if who not in replaced:
            worst = max((end / base for _, base, end, _ in lives), default=0.0)
            ok = bool(lives) and worst <= goal
            rows.append(Figure(f"RSS of {who}: after warm-up -> end, worst life", worst,
                               goal=f"<= {goal}x", met=ok, text=said))
            continue
        rows.append((f"RSS of {who}'s runners (chaos replaces them), by life", said))
        procs = per_process(sampler.samples, who)
        worst = max((end / base for _, base, end, _ in procs), default=0.0)
        seen = len({s.pid for s in sampler.samples if s.who == who})
        lived = f"{len(procs)} of {seen} lived past their own warm-up"
        rows.append(Figure(f"RSS of {who}'s runners: each after its own warm-up -> its end",
                           worst, goal=f"<= {goal}x", text=lived) if procs else
                    (f"RSS of {who}'s runners: each after its own warm-up -> its end", lived))
    warm, end = sampler.maps.get("warm", {}), sampler.maps.get("end", {})
    rows.append(("the daemon's first life, RSS by mapping, after warm-up -> end (KiB)",
                 ", ".join(f"{k} {warm.get(k, 0)}->{v}" for k, v in sorted(end.items()))))
    report("soak: an hour of every kind of traffic under chaos", rows)
    if tally.lost:
        print("\n== the first requests lost")
        print("\n".join(tally.lost))


if __name__ == "__main__":
    main()
