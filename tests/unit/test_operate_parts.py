"""Pure parts of operating exod: the in-memory log rings and the status table. (Hang watches
and eviction are the daemon's: tests/unit/test_traffic.py, on the fake clock.)"""

from __future__ import annotations

import itertools
from typing import Literal

from exod.wire import control_status as cs
from exod.core.states import State
from exod.daemon.log_ring import LogRings


def test_rings_are_bounded_per_rank_and_merged_by_time() -> None:
    clock = itertools.count(1.0)
    rings = LogRings(per_rank=3, clock=lambda: float(next(clock)))
    for i in range(5):
        rings.add({"instance": "a", "rank": i % 2, "pid": 10 + i % 2}, "INFO", f"line {i}")
    rings.add({"instance": "b", "rank": 0, "pid": 20}, "ERROR", "other")
    assert [ln.text for ln in rings.tail("a", 10, rank=0)] == ["line 0", "line 2", "line 4"]
    assert [ln.text for ln in rings.tail("a", 10)] == [f"line {i}" for i in range(5)]
    assert [ln.text for ln in rings.tail("a", 2)] == ["line 3", "line 4"]
    assert rings.tail("a", 0) == [] and rings.tail("nope", 5) == []
    for i in range(3, 6):  # rank 1 keeps only its last 3
        rings.add({"instance": "a", "rank": 1, "pid": 11}, "INFO", f"more {i}")
    assert [ln.text for ln in rings.tail("a", 10, rank=1)] == ["more 3", "more 4", "more 5"]
    assert rings.tail("b", 1)[0].to_json()["level"] == "ERROR"
    rings.forget("a")
    assert rings.tail("a", 10) == [] and len(rings.tail("b", 10)) == 1


def test_followers_see_new_lines_until_they_stop() -> None:
    rings = LogRings()
    seen: list[str] = []
    stop = rings.follow(lambda ln: seen.append(ln.text))
    rings.add({"instance": "a", "rank": 0, "pid": 1}, "INFO", "x" * 10_000)
    stop()
    rings.add({"instance": "a", "rank": 0, "pid": 1}, "INFO", "after")
    assert [len(t) for t in seen] == [4096]  # one line, cut to the ring's limit


def status_rank(error: str | None = None, exit_text: str | None = None,
                layers_total: int = 4) -> cs.RankStatus:
    return cs.RankStatus(
        rank=0, host="127.0.0.1", remote=False, pid=None, state=State.STOPPED, layers=[0, 4],
        layers_loaded=0, layers_total=layers_total, rss_bytes=None, uptime_s=None,
        last_exit=cs.ExitStatus(None, None, exit_text) if exit_text else None, status="",
        phase=None, error=error, no_progress_s=None, heartbeat_age_s=None, ladder=None)


def status_instance(name: str, state: str, detail: str, ranks: list[cs.RankStatus],
                    autostart: bool | Literal["on-demand"] = True,
                    reason: str | None = None) -> cs.InstanceStatus:
    return cs.InstanceStatus(
        name=name, state=State(state), detail=detail, reason=reason, since_s=1.0, uptime_s=None,
        model="/m", shards=len(ranks), parallelism="pipeline", autostart=autostart,
        restart="on-failure", restarts=1, source="", serving=None, ranks=ranks)


def status_snapshot(summary: str, instances: list[cs.InstanceStatus]) -> cs.Snapshot:
    return cs.Snapshot(cs.DaemonStatus(
        pid=1, version="0", uptime_s=5, state="running", config="/c", control_socket="/s",
        summary=summary, api=None, stop_worst_case_s=30.0), instances)


def test_status_table_says_hung_and_on_demand() -> None:
    from exod.cli.table import render_status

    snap = status_snapshot("0/2 ready", [
        status_instance("big", "stopping", "hung (no progress for 5m); stopping "
                                           "(SIGKILL in 20s if still running)", [status_rank()]),
        status_instance("coder", "stopped", "stopped (starts on demand)", [status_rank()],
                        autostart="on-demand")])
    lines = render_status(snap).splitlines()
    assert any(ln.startswith("big ") and "hung (no progress for 5m), stopping" in ln
               for ln in lines), lines
    assert any(ln.startswith("coder ") and "stopped (on demand)" in ln for ln in lines), lines


def test_status_table_says_why_a_group_is_backing_off() -> None:
    from exod.cli.table import render_status

    snap = status_snapshot("0/1 ready", [status_instance(
        "g", "backoff", "backoff: restart in 2.0s", reason="restart in 2.0s", ranks=[
            status_rank(None, "signal 15 (SIGTERM)", 2),
            status_rank("address 127.0.0.1:21001 is in use", "exit code 75", 2)])])
    line = render_status(snap).splitlines()[-1]
    assert line.startswith("g ") and line.endswith(
        "address 127.0.0.1:21001 is in use; restart in 2.0s"), line
