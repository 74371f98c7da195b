"""Supervision with real processes: the ladder against a runner that ignores everything,
restarts with backoff, the start limit, a model that cannot load, Ctrl-C, a second SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from collections.abc import Callable

from tests.harness import Daemon, pid_alive, wait_pid_gone
from tests.integration.conftest import double_env

FAST_LADDER = {"grace": "300ms", "attempts": 2, "interval": "300ms", "kill_interval": "200ms"}


def first_pid(inst: dict) -> int:
    return inst["ranks"][0]["pid"]


def test_stubborn_runner_goes_down_every_rung_and_is_killed_at_the_bound(
        daemons: Callable[..., Daemon], fake_model: Path) -> None:
    d = daemons({"instances": {"mule": {
        "model": str(fake_model), "stop": FAST_LADDER, "env": double_env("stubborn")}}})
    d.start()
    pid = first_pid(d.until_state("mule", "ready"))

    d.ctl("stop", "mule")  # returns once the runner is gone
    assert not pid_alive(pid)
    ladder = d.events(event="ladder")
    assert [e["extra"]["step"] for e in ladder] == ["ask", "SIGTERM", "SIGTERM", "SIGKILL"]
    assert {e["extra"]["pid"] for e in ladder} == {pid}
    t = [e["time"]["timestamp"] for e in ladder]
    # Rungs in order, each after its wait (0.3 s grace, 0.3 s between SIGTERMs): SIGKILL only
    # once the whole ladder (0.9 s) has passed. These are the log records' times, each written
    # a little after its rung; on a loaded machine one record can be late by tens of ms, so
    # each gap is only asked to be clearly a wait (no rung follows the last at once). The
    # ladder's own deadlines are exact in tests/unit/test_ladder.py.
    assert t[1] - t[0] >= 0.2 and t[2] - t[1] >= 0.2 and t[3] - t[2] >= 0.2
    assert t[3] - t[0] >= 0.85
    assert t[3] - t[0] < 10
    (ex,) = d.events(event="exit")
    assert ex["extra"]["signal"] == signal.SIGKILL
    inst = d.instance("mule")
    assert inst["state"] == "stopped"
    assert inst["ranks"][0]["last_exit"]["text"] == "signal 9 (SIGKILL)"
    assert d.terminate() == 0


def test_runner_killed_mid_load_restarts_with_backoff(daemons: Callable[..., Daemon],
                                                      fake_model: Path) -> None:
    d = daemons({"instances": {"slow": {
        "model": str(fake_model), "env": double_env("hang-loading"),
        "backoff": {"initial": "200ms", "jitter": 0}}}})
    d.start()
    inst = d.until_instance("slow", lambda i: i["ranks"][0]["layers_loaded"] == 1,
                            what="slow to report layer 1")
    assert inst["state"] == "loading"
    pid = first_pid(inst)
    os.kill(pid, signal.SIGKILL)

    back = d.until_state("slow", "backoff")
    assert back["ranks"][0]["last_exit"]["text"] == "signal 9 (SIGKILL)"
    assert back["restarts"] == 1
    again = d.until_instance("slow", lambda i: i["state"] == "loading"
                             and i["ranks"][0]["pid"] not in (None, pid),
                             what="slow to load again in a new process")
    assert again["restarts"] == 1
    states = [e["extra"]["new"] for e in d.events(event="state", instance="slow")]
    assert states[:6] == ["starting", "loading", "backoff", "starting", "loading"][:len(states[:6])]
    assert "backoff" in states and "failed" not in states
    assert d.terminate() == 0


def test_start_limit_leads_to_failed_until_started_again(daemons: Callable[..., Daemon],
                                                         fake_model: Path) -> None:
    d = daemons({"instances": {"crashy": {
        "model": str(fake_model), "env": double_env("crash"),
        "backoff": {"initial": "50ms", "jitter": 0},
        "start_limit": {"burst": 3, "interval": "1m"}}}})
    d.start()
    failed = d.until_state("crashy", "failed")
    assert "start limit" in failed["reason"]
    assert failed["restarts"] == 2  # 3 failures: 2 restarts, then the limit
    assert len(d.events(event="exit", instance="crashy")) == 3
    assert "exit code 1" in failed["ranks"][0]["last_exit"]["text"]

    # Failed stays failed: no timer brings it back. An operator's start does.
    res = d.ctl("start", "crashy")
    assert "crashy" in res.stdout
    d.until_instance("crashy", lambda i: i["state"] == "failed"
                     and len(d.events(event="exit", instance="crashy")) == 6,
                     what="crashy to fail again after 3 more tries")
    assert d.terminate() == 0


def test_corrupt_model_fails_at_once_with_a_readable_reason(daemons: Callable[..., Daemon],
                                                           tiny_model: Path,
                                                           tmp_path: Path) -> None:
    from tests.models.tiny import corrupt_model

    bad = corrupt_model(tiny_model, tmp_path / "corrupt")
    d = daemons({"instances": {"broken": {"model": str(bad)}}})
    d.start()
    failed = d.until_state("broken", "failed")
    assert failed["restarts"] == 0, "a model that cannot load must not be retried"
    rank = failed["ranks"][0]
    assert rank["last_exit"]["code"] == 65
    assert "safetensors" in rank["error"] and "corrupt" in rank["error"]
    assert rank["error"] in failed["reason"]
    table = d.ctl("status").stdout.splitlines()
    row = next(line for line in table if line.startswith("broken "))
    assert row.split()[1] == "failed" and "exit code 65" in row
    assert d.terminate() == 0


def test_ctrl_c_reaches_only_the_daemon_which_runs_the_ladder(
        daemons: Callable[..., Daemon], tiny_model: Path) -> None:
    d = daemons({"instances": {"tiny": {"model": str(tiny_model)}}})
    d.start(session=True)  # the daemon leads a process group, like a shell job
    pid = first_pid(d.until_state("tiny", "ready"))
    assert os.getpgid(pid) != os.getpgid(d.proc.pid), "runner must have its own process group"

    os.killpg(d.proc.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
    assert d.proc.wait(60) == 0
    assert wait_pid_gone(pid, 10)
    assert [e["extra"]["step"] for e in d.events(event="ladder")] == ["ask"]
    (ex,) = d.events(event="exit")
    assert ex["extra"]["code"] == 0


def test_second_sigterm_skips_grace_but_never_abandons_runners(
        daemons: Callable[..., Daemon], fake_model: Path) -> None:
    ladder = {"grace": "1h", "attempts": 1, "interval": "200ms", "kill_interval": "200ms"}
    d = daemons({"instances": {"mule": {
        "model": str(fake_model), "stop": ladder, "env": double_env("stubborn")}}})
    d.start()
    pid = first_pid(d.until_state("mule", "ready"))
    d.send_signal(signal.SIGTERM)
    d.until_state("mule", "stopping")
    d.send_signal(signal.SIGTERM)
    assert d.proc.wait(60) == 0  # long before the 1 h grace
    assert not pid_alive(pid), "the daemon must not exit while a runner lives"
    steps = [e["extra"]["step"] for e in d.events(event="ladder")]
    assert steps == ["ask", "SIGTERM", "SIGKILL"]


def test_runners_die_with_a_sigkilled_daemon(daemons: Callable[..., Daemon],
                                             tiny_model: Path) -> None:
    d = daemons({"instances": {"a": {"model": str(tiny_model)},
                               "b": {"model": str(tiny_model)}}})
    d.start()
    d.until_instance("b", lambda i: i["state"] == "ready")
    snap = d.until_instance("a", lambda i: i["state"] == "ready")
    pids = [first_pid(snap), first_pid(d.instance("b"))]
    d.proc.kill()
    d.proc.wait(10)
    for pid in pids:
        assert wait_pid_gone(pid, 30), f"runner {pid} outlived its daemon"


def test_bad_config_is_one_line_per_problem_and_exit_78(tmp_path: Path) -> None:
    from tests.harness import EXOD

    cfg = tmp_path / "bad.yaml"
    cfg.write_text("instances:\n  x:\n    modle: /nope\n    shards: two\n")
    for cmd in ("check", "run"):
        res = subprocess.run([*EXOD, cmd, "-c", str(cfg)], capture_output=True, text=True,
                             timeout=60, check=False)
        assert res.returncode == 78, res.stderr
        assert "Traceback" not in res.stderr
        assert f"{cfg}:3:5: instances.x.modle: unknown key" in res.stderr
        assert f"{cfg}:4:13: instances.x.shards:" in res.stderr
