"""Benchmark results as data (pure): bench.results records a run as one JSON line, and
bench.report turns the newest line of each file into docs/benchmarks.md's tables and plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import plots, report, results
from bench.common import report as show
from bench.results import Figure

PNG = b"\x89PNG\r\n\x1a\n"


def here() -> tuple[str, dict[str, Any]]:
    """The commit and machine, as bench.results.host finds them (it asks git and mlx)."""
    return "abc1234", {"cpu": "test", "cores": 2}


def run_line(date: str, figures: list[Figure], **extra: Any) -> dict[str, Any]:
    return {"bench": "serving", "date": date, "commit": "abc", "machine": {"cpu": "x"},
            "load": {"before": [1.0], "after": [2.0]},
            "figures": [f.as_json() for f in figures], **extra}


def test_a_goal_is_judged_the_way_it_reads() -> None:
    assert Figure("rate", 1.02, goal=">= 1.0x").met is True
    assert Figure("rate", 0.98, goal=">= 1.0x").met is False
    assert Figure("time", 0.98, goal="<= 1.0x").met is True
    assert Figure("time", 1.2, unit="ms", goal="≤ 1 ms").met is False
    assert Figure("lost", 0, unit="", goal="== 0").met is True
    # A goal in words is the bench's to judge; one it judged is kept as it said.
    assert Figure("gap", 3.0, goal="a few").met is None
    assert Figure("gap", 3.0, goal="a few", met=True).met is True


def test_rounds_give_the_range() -> None:
    f = Figure("rate", 1.05, rounds=[1.2, 0.3, 1.0, 1.1])
    assert (f.low, f.high) == (0.3, 1.2)
    assert f.line() == "1.050x (0.300-1.200)"


def test_a_run_is_one_json_line_with_its_figures(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "serving.jsonl"
    with results.run("serving", out, here):
        show("section one", [
            Figure("aggregate tok/s", 1.1, goal=">= 1.0x", rounds=[1.0, 1.2],
                   sides={"exod": 11.0, "mlx_lm.server": 10.0}, side_unit="tok/s",
                   at={"clients": 8}),
            ("a row in words", "32768-60999")])
    with results.run("serving", out, here):
        results.add(Figure("aggregate tok/s", 0.9, goal=">= 1.0x", at={"clients": 8}))
    with results.run("serving", out, here):
        pass  # showed nothing: no line
    printed = capsys.readouterr().out
    assert "aggregate tok/s, clients 8" in printed and "(goal >= 1.0x)  OK" in printed
    first, second = results.read(out)
    assert first["bench"] == "serving" and first["commit"] == "abc1234"
    assert first["machine"] == {"cpu": "test", "cores": 2}
    assert len(first["load"]["before"]) == 3 and len(first["load"]["after"]) == 3
    assert first["figures"] == [
        {"name": "aggregate tok/s", "value": 1.1, "unit": "x", "low": 1.0, "high": 1.2,
         "goal": ">= 1.0x", "met": True, "rounds": [1.0, 1.2],
         "sides": {"exod": 11.0, "mlx_lm.server": 10.0}, "side_unit": "tok/s",
         "at": {"clients": 8}, "section": "section one"},
        {"name": "a row in words", "unit": "", "text": "32768-60999",
         "section": "section one"}]
    assert second["figures"][0]["met"] is False


def test_a_run_that_fails_half_way_keeps_what_it_showed(tmp_path: Path) -> None:
    out = tmp_path / "x.jsonl"
    with pytest.raises(RuntimeError), results.run("x", out, here):
        results.add(Figure("first", 1.0))
        raise RuntimeError("the server died")
    (line,) = results.read(out)
    assert line["note"] == "ended early: RuntimeError: the server died"


def test_outside_a_run_nothing_is_recorded(tmp_path: Path) -> None:
    out = tmp_path / "x.jsonl"
    results.add(Figure("alone", 1.0))  # no run open: printed by its bench, not kept
    with results.run("x", out, here):
        results.add(Figure("inside", 1.0))
    results.add(Figure("after", 1.0))
    (line,) = results.read(out)
    assert [f["name"] for f in line["figures"]] == ["inside"]


def test_no_token_goes_into_the_record() -> None:
    got = results.knobs({"EXOD_BENCH_ROUNDS": "4", "EXOD_API_TOKEN": "s3cret", "HOME": "/h"})
    assert got == {"EXOD_BENCH_ROUNDS": "4"}


def test_the_page_shows_the_newest_run_with_its_goals_and_trend(tmp_path: Path) -> None:
    old = run_line("2026-12-02", [Figure("aggregate tok/s", 1.09, goal=">= 1.0x",
                                         at={"clients": 1})])
    new = run_line("2026-12-07T10:00:00+00:00", [
        Figure("aggregate tok/s", 0.95, goal=">= 1.0x", low=0.9, high=1.2, at={"clients": 1}),
        Figure("second-turn TTFT", 0.8, goal="<= 1.0x"),
        Figure("a long row", None, unit="", text="word " * 500)])
    older = run_line("2026-11-30", [Figure("aggregate tok/s", 1.5, at={"clients": 1})])
    # Appended out of date order: the newest is chosen by its date.
    page = report.page({"serving": [old, new, older], "load": []}, [("tok/s", None)], tmp_path)
    section = page.split("## serving", 1)[1]
    assert "| aggregate tok/s, clients 1 | >= 1.0x | 0.950x (0.900-1.200) | **no** | " \
           "1.500x (2026-11-30), 1.090x (2026-12-02) |" in section
    assert "| second-turn TTFT | <= 1.0x | 0.800x | yes |  |" in section
    assert "2026-12-07 10:00, load 1.0 → 2.0, commit abc" in section
    assert "| [serving](#serving) | 2026-12-07 10:00, load 1.0 → 2.0 | 1 of 2 |" in page
    assert "| [load](#load) | no run yet | |" in page
    assert "tok/s: no run yet." in page
    assert max(len(cell) for line in page.splitlines() if line.startswith("|")
               for cell in line.split(" | ")) <= report.CELL + 10


def test_equal_dates_take_the_line_appended_last() -> None:
    a, b = run_line("2026-12-04", []), run_line("2026-12-04", [])
    assert report.newest([a, b]) is b


def test_plots_are_pngs_and_missing_data_is_skipped(tmp_path: Path) -> None:
    serving = [run_line("2026-12-07", [
        Figure("aggregate tok/s", v / b, sides={"exod": v, "mlx_lm.server": b},
               side_unit="tok/s", at={"clients": n}) for n, v, b in
        ((1, 30.0, 28.0), (8, 120.0, 100.0), (32, 200.0, 190.0))])]
    prefix = [{**run_line("2026-12-07", [Figure(
        "burst of 8 / one alone", 1.6, sides={"burst of 8": 3.2, "one alone": 2.0})]),
        "bench": "prefix"}]
    made = dict((p.file, path) for p, path in
                plots.write_all({"serving": serving, "prefix": prefix}, tmp_path))
    assert made["ttft-by-prompt"] is None and made["speculative"] is None
    for name in ("serving-tok-s", "prefix-burst"):
        path = made[name]
        assert path is not None and path.read_bytes().startswith(PNG)


def test_write_makes_the_page_and_its_plots(tmp_path: Path) -> None:
    data = tmp_path / "bench" / "results"
    data.mkdir(parents=True)
    line = run_line("2026-12-07", [Figure("speculative tok/s", 1.3, at={"clients": c},
                                          sides={"draft": 13.0 * c, "no draft": 10.0 * c},
                                          side_unit="tok/s") for c in (1, 4, 8)])
    (data / "models.jsonl").write_text(json.dumps({**line, "bench": "models"}) + "\n")
    page = report.write(tmp_path).read_text()
    assert "![Speculative decoding by clients: draft vs no draft](benchmarks/speculative.png)" \
        in page
    assert (tmp_path / "docs" / "benchmarks" / "speculative.png").read_bytes().startswith(PNG)
