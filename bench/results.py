"""Benchmark results as data: one JSON line a run in `bench/results/NAME.jsonl`.

`python -m bench NAME` opens a run (`run(NAME)`: the date, commit, machine and load before),
every figure a bench shows through `bench.common.report` (or `add`) joins it, and the run's
line is appended when the bench ends (with the load after). A `Figure` is the value with its
unit, range, goal and whether the goal is met; a plain `(label, text)` row is kept as its text.
`bench.report` turns the newest line of each file into docs/benchmarks.md; older lines are
the history. Outside a run (a module run by itself), figures are printed, not recorded.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from functools import cache
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# EXOD_BENCH_RESULTS moves the files (a scratch run that should not join the history).
DIR = Path(os.environ.get("EXOD_BENCH_RESULTS") or REPO / "bench" / "results")

_GOAL = re.compile(r"^\s*(>=|<=|>|<|==|≥|≤)\s*([-+]?[0-9.]+)")
_OPS = {"≥": ">=", "≤": "<="}


@dataclass
class Figure:
    """One figure of a run. `goal` is written as it reads, e.g. ">= 1.0x", "<= 2 ms", "== 0";
    `met` is judged from it when not given. `sides` holds each side's own value (unit
    `side_unit`) when `value` is their ratio; `at` says where on a curve the figure sits, e.g.
    {"clients": 8}, for the plots; `rounds` are the per-round values behind a median."""

    name: str
    value: float | None
    unit: str = "x"
    low: float | None = None
    high: float | None = None
    goal: str | None = None
    met: bool | None = None
    rounds: list[float] | None = None
    sides: dict[str, float] | None = None
    side_unit: str | None = None
    at: dict[str, Any] | None = None
    text: str | None = None  # words: the whole row without a value, else a detail after it
    section: str | None = None  # the heading it was printed under

    def __post_init__(self) -> None:
        if self.rounds and self.low is None and self.high is None:
            self.low, self.high = min(self.rounds), max(self.rounds)
        if self.met is None and self.goal is not None and self.value is not None:
            self.met = meets(self.value, self.goal)

    def label(self) -> str:
        """The name with where it sits: "aggregate tok/s, clients 8"; a figure's identity
        from run to run (the trends follow it)."""
        return self.name + "".join(f", {k.replace('_', ' ')} {v}"
                                   for k, v in (self.at or {}).items())

    def line(self) -> str:
        """The figure as a report row prints it."""
        parts = []
        if self.sides:
            parts.append("  ".join(f"{k} {fmt(v)} {self.side_unit or ''}".rstrip()
                                   for k, v in self.sides.items()))
        if self.value is not None:
            parts.append(value_text(self))
        if self.text or self.value is None:
            parts.append(self.text or "-")
        if self.goal is not None:
            parts.append(f"(goal {self.goal})")
        if self.met is not None:
            parts.append("OK" if self.met else "MISSED")
        return "  ".join(parts)

    def as_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Figure:
        """A figure as a line holds it (a key this version does not know is left out)."""
        known = {f.name for f in fields(cls)}
        return cls(**{"value": None, **{k: v for k, v in d.items() if k in known}})


def fmt(v: float, unit: str = "") -> str:
    """A value with about three significant figures; a ratio with three decimals."""
    if unit == "x" and 0.001 <= abs(v) < 10:  # a ratio: its third decimal meets a goal
        return f"{v:.3f}" if abs(v) < 2 else f"{v:.2f}"
    if v == 0 or abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    if abs(v) >= 0.01:
        return f"{v:.3g}" if abs(v) < 1 else f"{v:.2f}"
    return f"{v:.2g}"


def value_text(f: Figure) -> str:
    """'1.03x (0.95-1.19)', '41 ms', or '-' when the figure has no value."""
    if f.value is None:
        return "-"
    unit = f.unit if f.unit in ("x", "%") else f" {f.unit}" if f.unit else ""
    out = f"{fmt(f.value, f.unit)}{unit}"
    if f.low is not None and f.high is not None:
        out += f" ({fmt(f.low, f.unit)}-{fmt(f.high, f.unit)})"
    return out


def meets(value: float, goal: str) -> bool | None:
    """Whether `value` meets a goal such as ">= 1.0x" (None: a goal this cannot read)."""
    m = _GOAL.match(goal)
    if not m:
        return None
    op, bound = _OPS.get(m[1], m[1]), float(m[2])
    return {">=": value >= bound, "<=": value <= bound, ">": value > bound,
            "<": value < bound, "==": value == bound}[op]


@dataclass
class Run:
    """One run of one bench, as its JSON line holds it."""

    bench: str
    date: str
    commit: str
    machine: dict[str, Any]
    load_before: list[float]
    figures: list[Figure] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    note: str | None = None
    t0: float = field(default_factory=time.monotonic)

    def as_json(self, load_after: list[float]) -> dict[str, Any]:
        out: dict[str, Any] = {
            "bench": self.bench, "date": self.date, "commit": self.commit,
            "machine": self.machine, "load": {"before": self.load_before, "after": load_after},
            "took_s": round(time.monotonic() - self.t0, 1), "env": self.env,
            "figures": [f.as_json() for f in self.figures]}
        if self.note:
            out["note"] = self.note
        return out


_current: list[Run] = []


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def commit() -> str:
    """HEAD's short hash, "+dirty" when the tree has changes ("unknown" outside git)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
    try:
        dirty = "+dirty" if git("status", "--porcelain", "--untracked-files=no") else ""
        return git("rev-parse", "--short=10", "HEAD") + dirty
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    try:  # macOS
        return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or platform.machine()


@cache
def backend() -> dict[str, str]:
    """mlx's version and default device, asked of a child: a bench process never imports mlx."""
    code = ("import json, mlx.core as mx, importlib.metadata as m\n"
            "print(json.dumps({'mlx': m.version('mlx'), 'device': str(mx.default_device()),"
            " 'metal': bool(mx.metal.is_available())}))")
    try:
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=60, check=True)
        got: dict[str, str] = json.loads(res.stdout.strip().splitlines()[-1])
        return got
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return {"mlx": "unknown"}


def machine() -> dict[str, Any]:
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "ram_gib": round(pages / 2**30, 1),
            "os": platform.platform(), "python": platform.python_version(),
            "backend": backend()}


def knobs(env: Mapping[str, str]) -> dict[str, str]:
    """The EXOD_ settings a run had (what changes a figure), never a token or key."""
    return {k: v for k, v in env.items() if k.startswith("EXOD_")
            and not any(w in k for w in ("TOKEN", "KEY", "SECRET", "PASS"))}


def host() -> tuple[str, dict[str, Any]]:
    return commit(), machine()


@contextmanager
def run(bench: str, out: Path | None = None,
        about: Callable[[], tuple[str, dict[str, Any]]] = host) -> Iterator[Run]:
    """Records one run of `bench`: its line is appended to `out` (DIR/bench.jsonl) at the end,
    when it showed a figure, even if it failed half-way (with a note saying so). `about`
    gives the commit and the machine."""
    now = datetime.datetime.now(datetime.timezone.utc)
    rev, where = about()
    r = Run(bench=bench, date=now.isoformat(timespec="seconds"), commit=rev, machine=where,
            load_before=loadavg(), env=knobs(os.environ))
    _current.append(r)
    try:
        yield r
    except BaseException as e:
        r.note = f"ended early: {type(e).__name__}: {e}"
        raise
    finally:
        _current.remove(r)
        if r.figures:
            path, after = out or DIR / f"{bench}.jsonl", loadavg()
            write(r.as_json(after), path)
            print(f"\n({bench}: load average {r.load_before[0]:.1f} -> {after[0]:.1f}; "
                  f"recorded in {path})")


def write(record: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(record, ensure_ascii=False) + "\n")


def add(*figures: Figure, section: str | None = None) -> None:
    """Adds figures to the run in progress (none: nothing is recorded)."""
    if not _current:
        return
    for f in figures:
        if section is not None and f.section is None:
            f.section = section
        _current[-1].figures.append(f)


def note(text: str) -> None:
    """A line of words for the run in progress (what a figure cannot say)."""
    if _current:
        r = _current[-1]
        r.note = f"{r.note}\n{text}" if r.note else text


def read(path: Path) -> list[dict[str, Any]]:
    """The runs of one file, oldest first (the order they were appended in)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
