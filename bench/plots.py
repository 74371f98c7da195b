"""The plots of docs/benchmarks.md: the figures people compare most, each side against its
baseline, from the newest run of a bench that recorded them (`make bench-report`).

A plot takes the figures of one name in one bench's newest run that carry `sides` (each
side's own value): with `x`, one line a side over the figures' `at[x]` (tok/s by clients);
without, one bar a side. A bench records such figures with bench.results.Figure(name, ratio,
sides={...}, side_unit=..., at={...}). A plot whose figures no run has yet is skipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Plot:
    file: str  # docs/benchmarks/FILE.png
    title: str
    bench: str
    figure: str  # the name of the figures plotted
    unit: str  # the sides' unit, the y axis
    x: str | None = None  # the key of `at` along the x axis; None: bars
    xlabel: str = ""


PLOTS = [
    Plot("serving-tok-s", "Aggregate tok/s by clients: exod vs mlx_lm.server", "serving",
         "aggregate tok/s", "tok/s", x="clients", xlabel="concurrent clients"),
    Plot("ttft-by-prompt", "Time to first token by prompt length", "api",
         "time to first token", "ms", x="prompt_tokens", xlabel="prompt tokens"),
    Plot("prefix-burst", "First tokens: 8 sharing a ~6k-token prefix vs one alone", "prefix",
         "burst of 8 / one alone", "s"),
    Plot("speculative", "Speculative decoding by clients: draft vs no draft", "models",
         "speculative tok/s", "tok/s", x="clients", xlabel="concurrent clients"),
]


def points(plot: Plot, runs: Sequence[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """The date of the newest run that has the plot's figures, and those figures, by x."""
    for run in sorted(runs, key=lambda r: r.get("date") or "", reverse=True):
        got = [f for f in run.get("figures", [])
               if f.get("name") == plot.figure and f.get("sides")
               and (plot.x is None or plot.x in (f.get("at") or {}))]
        if got:
            got = sorted(got, key=lambda f: f["at"][plot.x]) if plot.x else got
            return (run.get("date") or "undated")[:10], got
    return "", []


def draw(plot: Plot, date: str, figs: Sequence[dict[str, Any]], out: Path) -> None:
    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend

    fig = Figure(figsize=(6.4, 4.0), dpi=100)
    ax = fig.subplots()
    if plot.x:
        xs = [f["at"][plot.x] for f in figs]
        for side in dict.fromkeys(k for f in figs for k in f["sides"]):
            ys = [f["sides"].get(side) for f in figs]
            ax.plot(xs, ys, marker="o", label=side)
        ax.set_xlabel(plot.xlabel)
        if len(xs) > 1 and max(xs) / max(min(xs), 1) >= 8:
            ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.legend()
    else:
        sides = figs[-1]["sides"]
        ax.bar(list(sides), list(sides.values()), color="tab:blue")
    ax.set_ylabel(plot.unit)
    ax.set_ylim(bottom=0)
    ax.set_title(f"{plot.title} ({date})", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")


def write_all(data: dict[str, list[dict[str, Any]]],
              folder: Path) -> list[tuple[Plot, Path | None]]:
    """Each plot drawn into `folder` (None where no run has its figures yet)."""
    made: list[tuple[Plot, Path | None]] = []
    for plot in PLOTS:
        date, figs = points(plot, data.get(plot.bench, []))
        path = folder / f"{plot.file}.png" if figs else None
        if path is not None:
            draw(plot, date, figs, path)
        made.append((plot, path))
    return made
