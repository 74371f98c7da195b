"""exod as a real systemd 252 service: readiness under both ready policies (and the start
timeout extended by a progressing load), STATUS= in `systemctl status`, reload, the watchdog,
stop through exod's own ladder (also past a short TimeoutStopSec), and no runner outliving a
SIGKILLed daemon.

Every test drives the shipped unit, adapted only in paths (tests/system/systemd.py,
adapt_exod_unit). A drop-in is installed only where a test needs a shorter timeout, and each
such test says why. One guest serves the whole module; tests synchronise on unit properties,
the journal and `exoctl status --json`, never on fixed sleeps.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from exod.daemon.readiness import EXTEND_BY, TICK
from tests.system.systemd import (
    CONFIG_PATH,
    FAKE_MODEL,
    VENV_EXOD,
    GuestError,
    SystemdGuest,
)

pytestmark = pytest.mark.system

UNIT = "exod.service"
EXOCTL = str(VENV_EXOD.parent / "exoctl")
SOCKET = "/run/exod/control.sock"
BOUND = 30.0  # seconds: only a bound against hangs; tests wait for events
TEST_DIR = "/var/lib/exod-test"  # guest-private tmpfs, readable by user exod under the hardening
# The shipped ladder's worst case is 25 s: tests that meet a stubborn runner use a short one
# (worst case 1 + 2 × 1 = 3 s) so that exod's SIGKILL comes within seconds.
SHORT_LADDER = {"grace": "1s", "attempts": 2, "interval": "1s"}


# ---- config -------------------------------------------------------------------------------------
def fake_model(g: SystemdGuest, layers: int) -> str:
    """A model directory the doubles "load": only config.json, for exod's layer count."""
    path = f"{TEST_DIR}/fake-{layers}"
    g.write(f"{path}/config.json",
            json.dumps({"model_type": "llama", "num_hidden_layers": layers}) + "\n")
    return path


def double(behaviour: str, model: str = FAKE_MODEL, stop: dict[str, Any] | None = None,
           **env: str) -> dict[str, Any]:
    """An instance served by a runner double (tests/doubles/runner.py)."""
    inst: dict[str, Any] = {"model": model, "env": {"EXOD_DOUBLE": behaviour, **env}}
    if stop:
        inst["stop"] = stop
    return inst


def write_config(g: SystemdGuest, instances: dict[str, dict[str, Any]],
                 ready: str = "instances", **top: Any) -> None:
    # JSON is YAML: no quoting surprises in env values such as "0.5". api.listen "" keeps the
    # HTTP API out of these tests (every guest has its own network namespace anyway).
    cfg = {"ready": ready, "api": {"listen": ""}, **top, "instances": instances}
    g.write(CONFIG_PATH, json.dumps(cfg, indent=1) + "\n")


# ---- observing the service -----------------------------------------------------------------------
@contextlib.contextmanager
def background(g: SystemdGuest, *cmd: str) -> Iterator[subprocess.Popen[str]]:
    """`cmd` in the guest, running while the block observes it (e.g. a `systemctl start`
    blocked on readiness); killed on the way out if it has not finished."""
    proc = g.popen(*cmd)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def wait_until(what: str, probe: Callable[[], Any], timeout: float = BOUND,
               g: SystemdGuest | None = None) -> Any:
    """Poll `probe` until it returns something truthy; that value. A GuestError if it never
    does, with the unit's diagnostics."""
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > deadline:
            extra = g.diagnostics(UNIT) if g is not None else ""
            raise GuestError(f"not within {timeout}s: {what}\n{extra}")
        time.sleep(0.02)


def status(g: SystemdGuest) -> dict[str, Any] | None:
    """`exoctl status --json` as root against the unit's control socket; None if exod is not
    answering (not started yet, or gone)."""
    res = g.run(EXOCTL, "--socket", SOCKET, "status", "--json")
    return json.loads(res.stdout) if res.returncode == 0 else None


def instances(snap: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {i["name"]: i for i in snap["instances"]}


def pids(snap: dict[str, Any]) -> dict[str, int]:
    return {i["name"]: i["ranks"][0]["pid"] for i in snap["instances"]}


def wait_status(g: SystemdGuest, what: str, pred: Callable[[dict[str, Any]], bool],
                timeout: float = BOUND) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        snap = status(g)
        return snap if snap is not None and pred(snap) else None

    return wait_until(what, probe, timeout, g)


def all_ready(names: set[str]) -> Callable[[dict[str, Any]], bool]:
    def pred(snap: dict[str, Any]) -> bool:
        got = instances(snap)
        return set(got) == names and all(i["state"] == "ready" for i in got.values())

    return pred


def wait_status_text(g: SystemdGuest, pred: Callable[[str], bool], what: str) -> str:
    def probe() -> str | None:
        text = g.show(UNIT, "StatusText")
        return text if pred(text) else None

    return wait_until(f"StatusText {what}", probe, g=g)


def invocation(g: SystemdGuest) -> str:
    inv = g.show(UNIT, "InvocationID")
    assert re.fullmatch(r"[0-9a-f]{32}", inv), inv
    return inv


def journal_of(g: SystemdGuest, inv: str, *args: str) -> str:
    """One run of the unit: exod's own lines (_SYSTEMD_INVOCATION_ID) and systemd's about it
    (INVOCATION_ID), without those of earlier tests in this guest."""
    return g.run("journalctl", "--no-pager", "--quiet", "-o", "cat", *args,
                 f"_SYSTEMD_INVOCATION_ID={inv}", "+", f"INVOCATION_ID={inv}").stdout


def wait_journal_of(g: SystemdGuest, inv: str, text: str) -> str:
    """journald reads the service's stream asynchronously: wait for `text` to arrive."""
    def probe() -> str | None:
        log = journal_of(g, inv)
        return log if text in log else None

    return wait_until(f"{text!r} in the journal of invocation {inv}", probe, g=g)


def assert_stopped_cleanly(g: SystemdGuest, inv: str) -> None:
    """The properties of THAT run (install_exod enables the unit, so it stays loaded and is not
    replaced by a freshly loaded one whose Result= is success by default)."""
    props = g.properties(UNIT, "InvocationID", "ActiveState", "Result", "ExecMainStatus")
    assert props == {"InvocationID": inv, "ActiveState": "inactive", "Result": "success",
                     "ExecMainStatus": "0"}, props


def exod_processes(g: SystemdGuest) -> str:
    """Every process of user exod in the guest: the daemon and all its runners."""
    return g.run("pgrep", "-a", "-u", "exod").stdout


# ---- fixtures ------------------------------------------------------------------------------------
@pytest.fixture
def dropin(exod_unit: SystemdGuest) -> Iterator[Callable[[str], None]]:
    """Install a [Service] drop-in for exod.service for one test (then daemon-reload); removed
    afterwards."""
    paths: list[Path] = []

    def install(text: str) -> None:
        paths.append(exod_unit.install_dropin(UNIT, f"test-{len(paths)}",
                                              "[Service]\n" + text))
        exod_unit.daemon_reload()

    yield install
    for p in paths:
        p.unlink()
    if paths:
        exod_unit.daemon_reload()


@pytest.fixture
def gate(exod_unit: SystemdGuest) -> Iterator[str]:
    """A file the `gated` double waits for before its last layer; absent at first."""
    path = f"{TEST_DIR}/gate"
    exod_unit.path(path).unlink(missing_ok=True)
    yield path
    exod_unit.path(path).unlink(missing_ok=True)


# ---- 1. readiness --------------------------------------------------------------------------------
def test_ready_daemon_returns_while_an_instance_is_still_loading(exod_unit: SystemdGuest) -> None:
    """`ready: daemon`: READY=1 once the control socket is up and the runners are spawned; a
    runner that never finishes loading does not hold `systemctl start` back."""
    g = exod_unit
    write_config(g, {"slow": double("hang-loading")}, ready="daemon")
    res = g.systemctl("start", UNIT)
    assert res.returncode == 0, res.stderr
    assert g.show(UNIT, "ActiveState") == "active"
    snap = status(g)
    assert snap is not None and instances(snap)["slow"]["state"] in ("starting", "loading"), snap
    g.wait_property(UNIT, "StatusText", "0/1 ready; slow: loading 1/4", timeout=BOUND)
    assert instances(status(g) or {"instances": []})["slow"]["detail"] == "loading 1/4"


def test_ready_instances_blocks_start_until_the_load_is_done(exod_unit: SystemdGuest,
                                                             gate: str) -> None:
    """`ready: instances`: `systemctl start` is still blocked while exod itself reports the
    instance loading, and returns once the load completes (the test opens the double's gate)."""
    g = exod_unit
    write_config(g, {"gated": double("gated", EXOD_DOUBLE_GATE=gate)})
    with background(g, "systemctl", "start", UNIT) as start:
        snap = wait_status(g, "gated loading 3/4 (waiting at its gate)",
                           lambda s: instances(s)["gated"]["detail"] == "loading 3/4")
        # exod answers and reports the load; systemd has not seen READY=1, so start waits.
        assert start.poll() is None, ("`systemctl start` returned while loading",
                                      start.communicate())
        props = g.properties(UNIT, "ActiveState", "SubState", "StatusText")
        assert props == {"ActiveState": "activating", "SubState": "start",
                         "StatusText": "0/1 ready; gated: loading 3/4"}, props
        assert snap["daemon"]["state"] == "running"

        g.write(gate, "")
        _, err = start.communicate(timeout=BOUND)
    assert start.returncode == 0, err
    props = g.properties(UNIT, "ActiveState", "StatusText")
    assert props == {"ActiveState": "active", "StatusText": "1/1 ready"}, props


def test_reload_during_a_ready_instances_start_does_not_end_it_early(exod_unit: SystemdGuest,
                                                                     gate: str) -> None:
    """`systemctl reload` waits for a pending start job, but `exoctl reload` (or kill -HUP) does
    not: readiness must still wait for the instances."""
    g = exod_unit
    write_config(g, {"gated": double("gated", EXOD_DOUBLE_GATE=gate)})
    with background(g, "systemctl", "start", UNIT) as start:
        wait_status(g, "gated loading 3/4 (waiting at its gate)",
                    lambda s: instances(s)["gated"]["detail"] == "loading 3/4")
        res = g.run(EXOCTL, "--socket", SOCKET, "reload")  # returns once exod has reloaded
        assert res.returncode == 0, res.stderr
        # exod's notify messages are in systemd's queue by now, and systemd handles its notify
        # socket before a client's request: the answer below already reflects them.
        props = g.properties(UNIT, "ActiveState", "StatusText")
        assert props == {"ActiveState": "activating",
                         "StatusText": "0/1 ready; gated: loading 3/4"}, props
        assert start.poll() is None, "`systemctl start` returned while the instance was loading"
        g.write(gate, "")
        _, err = start.communicate(timeout=BOUND)
    assert start.returncode == 0, err
    assert g.show(UNIT, "StatusText") == "1/1 ready"


def test_invalid_config_fails_the_start_with_errno_and_no_restart(
        exod_unit: SystemdGuest) -> None:
    """ERRNO= and STATUS= on a fatal start error; exit 78 (EX_CONFIG) is in
    RestartPreventExitStatus=, so systemd does not retry what cannot fix itself."""
    g = exod_unit
    g.write(CONFIG_PATH, "instances:\n  broken:\n    model: 42\n    shards: lots\n")
    res = g.systemctl("start", UNIT)
    assert res.returncode != 0
    g.wait_property(UNIT, "ActiveState", "failed")
    props = g.properties(UNIT, "Result", "ExecMainStatus", "StatusErrno", "StatusText",
                         "NRestarts")
    assert props == {"Result": "exit-code", "ExecMainStatus": "78", "StatusErrno": "22",
                     "StatusText": f"invalid configuration {CONFIG_PATH}",
                     "NRestarts": "0"}, props
    log = wait_journal_of(g, invocation(g), "not starting")
    assert f"invalid configuration {CONFIG_PATH}: not starting" in log, log
    errors = journal_of(g, invocation(g), "--priority=err")
    assert "instances.broken.shards" in errors, errors

def test_a_slow_start_outlives_timeout_start_sec(exod_unit: SystemdGuest,
                                                 dropin: Callable[[str], None]) -> None:
    """Drop-in TimeoutStartSec=2s: a start far longer than that still succeeds, because exod
    extends the start timeout on a fixed tick for as long as a runner of a starting instance
    lives, from the spawn on: 4 s before the first layer (an import, a wait for peers) and 4 s
    between layers, longer than the timeout and than one tick (readiness.TICK)."""
    g = exod_unit
    dropin("TimeoutStartSec=2s\n")
    assert g.show(UNIT, "TimeoutStartUSec") == "2s"
    write_config(g, {"slow": double("gated", fake_model(g, 3), EXOD_DOUBLE_FIRST_SECONDS="4",
                                    EXOD_DOUBLE_LAYER_SECONDS="4")})
    t = time.monotonic()
    res = g.systemctl("start", UNIT)
    elapsed = time.monotonic() - t
    assert res.returncode == 0, res.stderr
    assert elapsed > 2 * TICK, f"the start took only {elapsed:.2f}s: it proves nothing"
    assert g.properties(UNIT, "ActiveState", "StatusText") == {
        "ActiveState": "active", "StatusText": "1/1 ready"}


def test_timeout_start_sec_still_fires_when_exod_itself_is_stuck(
        exod_unit: SystemdGuest, dropin: Callable[[str], None], gate: str) -> None:
    """The control for the test above: the runner lives and never finishes loading, so exod
    would extend forever, until exod itself stops (SIGSTOP): no tick, no extension, and the
    start times out (Result=timeout) within one extension. systemd's SIGTERM comes with a
    SIGCONT, and exod stops its runner through the ladder (rung 1) before it exits."""
    g = exod_unit
    dropin("TimeoutStartSec=2s\n")
    write_config(g, {"stuck": double("gated", fake_model(g, 2), EXOD_DOUBLE_GATE=gate)})
    with background(g, "systemctl", "start", UNIT) as start:
        wait_status(g, "the runner loading", lambda s: instances(s)["stuck"]["state"] == "loading")
        main_pid = g.show(UNIT, "MainPID")
        assert g.run("kill", "-STOP", main_pid).returncode == 0
        t = time.monotonic()
        assert start.wait(BOUND) != 0
        elapsed = time.monotonic() - t
    assert elapsed <= EXTEND_BY + 2, elapsed
    g.wait_property(UNIT, "Result", "timeout")
    log = wait_journal_of(g, invocation(g), "exod stopped")
    assert "start operation timed out" in log, log
    assert "ladder rung 1" in log and "ladder rung 2" not in log, log


# ---- 2. status -----------------------------------------------------------------------------------
def test_status_shows_a_multi_instance_summary(exod_unit: SystemdGuest) -> None:
    g = exod_unit
    write_config(g, {"fast": double("cooperative"), "slow": double("hang-loading")},
                 ready="daemon")
    assert g.systemctl("start", UNIT).returncode == 0
    g.wait_property(UNIT, "StatusText", "1/2 ready; slow: loading 1/4", timeout=BOUND)
    out = g.systemctl("status", UNIT).stdout
    assert 'Status: "1/2 ready; slow: loading 1/4"' in out, out

    # It stays current: an operator stop shows up at once.
    res = g.run(EXOCTL, "--socket", SOCKET, "stop", "slow")
    assert res.returncode == 0, res.stderr
    g.wait_property(UNIT, "StatusText", "1/2 ready; slow: stopped", timeout=BOUND)
    assert 'Status: "1/2 ready; slow: stopped"' in g.systemctl("status", UNIT).stdout


# ---- 3. reload -----------------------------------------------------------------------------------
def test_reload_restarts_only_the_changed_instance(exod_unit: SystemdGuest) -> None:
    """ExecReload=kill -HUP: `systemctl reload` returns once kill has, before exod is done, so
    the test synchronises on exod's status and StatusText."""
    g = exod_unit
    names = {"a", "b", "c"}
    v1 = {n: double("cooperative", EXOD_TEST_GEN="1") for n in sorted(names)}
    write_config(g, v1)
    assert g.systemctl("start", UNIT).returncode == 0
    inv, main_pid = invocation(g), g.show(UNIT, "MainPID")
    before = pids(wait_status(g, "a, b, c ready", all_ready(names)))

    v2 = {**v1, "b": double("cooperative", EXOD_TEST_GEN="2")}
    write_config(g, v2)
    res = g.systemctl("reload", UNIT)
    assert res.returncode == 0, res.stderr
    after = pids(wait_status(g, "b ready with a new runner", lambda s: all_ready(names)(s)
                             and pids(s)["b"] != before["b"]))
    assert after["a"] == before["a"] and after["c"] == before["c"], (before, after)
    g.wait_property(UNIT, "ActiveState", "active")
    g.wait_property(UNIT, "StatusText", "3/3 ready")
    assert g.show(UNIT, "MainPID") == main_pid
    wait_journal_of(g, inv, "Reloaded exod.service")
    log = wait_journal_of(g, inv, "reloaded: 0 added, 0 removed, 1 changed, 2 unchanged")
    assert log.count("ladder rung 1") == 1 and "ladder rung 2" not in log, log

    # A bad edit: exod rejects the whole file and changes nothing; the error is in STATUS=.
    # `systemctl reload` itself still succeeds (kill did deliver SIGHUP).
    write_config(g, {**v2, "c": {**v2["c"], "colour": "blue"}})
    res = g.systemctl("reload", UNIT)
    assert res.returncode == 0, res.stderr
    text = wait_status_text(g, lambda t: t.startswith("reload failed"), "saying reload failed")
    assert re.fullmatch(r"reload failed \(1 problem\(s\)\): .*colour.*; 3/3 ready", text), text
    g.wait_property(UNIT, "ActiveState", "active")
    snap = status(g)
    assert snap is not None and all_ready(names)(snap) and pids(snap) == after, snap
    assert g.show(UNIT, "MainPID") == main_pid
    errors = wait_journal_of(g, inv, "reload failed: 1 problem(s); nothing was changed")
    assert "reload failed" in journal_of(g, inv, "--priority=err"), errors

    # Fixed again: the error leaves STATUS=, still nothing restarted (the file equals v2).
    write_config(g, v2)
    assert g.systemctl("reload", UNIT).returncode == 0
    g.wait_property(UNIT, "StatusText", "3/3 ready")
    wait_journal_of(g, inv, "reloaded: 0 added, 0 removed, 0 changed, 3 unchanged")
    assert pids(status(g) or {"instances": []}) == after


# ---- 4. watchdog ---------------------------------------------------------------------------------
def test_watchdog_kills_a_frozen_daemon(exod_unit: SystemdGuest,
                                        dropin: Callable[[str], None]) -> None:
    """Drop-in WatchdogSec=2s (the shipped 30 s would make this test slow). SIGSTOP freezes
    exod's loop: its pings stop, systemd aborts it (Result=watchdog) and schedules a restart
    (Restart=on-failure, RestartSec=5: the fixture's stop cancels it). No runner is left."""
    g = exod_unit
    dropin("WatchdogSec=2s\n")
    write_config(g, {"fake": double("cooperative")})
    assert g.systemctl("start", UNIT).returncode == 0
    inv, main_pid = invocation(g), g.show(UNIT, "MainPID")
    assert g.show(UNIT, "WatchdogUSec") == "2s"
    runner = pids(wait_status(g, "fake ready", all_ready({"fake"})))["fake"]
    wait_journal_of(g, inv, "watchdog: pinging every 1.0s")

    t = time.monotonic()
    assert g.run("kill", "-STOP", main_pid).returncode == 0
    g.wait_property(UNIT, "Result", "watchdog", timeout=BOUND)
    elapsed = time.monotonic() - t
    assert 0.5 < elapsed < 10, elapsed  # 1-2 s: 2 s after the last ping
    # Result is set as the watchdog fires; systemd then passes through stop-watchdog (SIGABRT)
    # and final-sigkill (what is left in the cgroup) before it schedules the restart.
    g.wait_property(UNIT, "SubState", "auto-restart", timeout=BOUND)
    props = g.properties(UNIT, "SubState", "ExecMainStatus")
    assert props["ExecMainStatus"] == "6", props  # SIGABRT, then SIGCONT from systemd
    log = wait_journal_of(g, inv, "Watchdog timeout")
    assert not exod_processes(g), (exod_processes(g), log)
    assert g.run("kill", "-0", str(runner)).returncode != 0


# ---- 5. stop -------------------------------------------------------------------------------------
def test_stop_cooperative_runners_leave_at_rung_1(exod_unit: SystemdGuest) -> None:
    g = exod_unit
    write_config(g, {"a": double("cooperative"), "b": double("cooperative")})
    assert g.systemctl("start", UNIT).returncode == 0
    inv = invocation(g)
    wait_status(g, "a, b ready", all_ready({"a", "b"}))

    res = g.systemctl("stop", UNIT)
    assert res.returncode == 0, res.stderr
    assert_stopped_cleanly(g, inv)
    log = wait_journal_of(g, inv, "exod stopped")
    assert log.count("ladder rung 1: asking to shut down") == 2, log
    assert "ladder rung 2" not in log and "ladder rung 3" not in log, log
    assert re.search(r"\[a/0 pid \d+\] exited: exit code 0$", log, re.MULTILINE), log
    assert re.search(r"\[b/0 pid \d+\] exited: exit code 0$", log, re.MULTILINE), log
    assert "Killing process" not in log, log  # systemd had nothing left to kill
    assert not exod_processes(g)


def stop_stubborn(g: SystemdGuest) -> tuple[float, str, str]:
    """Start one stubborn runner with the short ladder, `systemctl stop` it while checking that
    systemd shows the stop (STOPPING=1 and its STATUS=): (seconds, invocation, journal)."""
    write_config(g, {"mule": double("stubborn", stop=SHORT_LADDER)})
    assert g.systemctl("start", UNIT).returncode == 0
    inv = invocation(g)
    wait_status(g, "mule ready", all_ready({"mule"}))
    t = time.monotonic()
    with background(g, "systemctl", "stop", UNIT) as stop:
        g.wait_property(UNIT, "StatusText", "stopping; ladder worst case 3s")
        assert g.show(UNIT, "ActiveState") == "deactivating"
        _, err = stop.communicate(timeout=BOUND)
    elapsed = time.monotonic() - t
    assert stop.returncode == 0, err
    return elapsed, inv, wait_journal_of(g, inv, "exod stopped")


def assert_exod_killed_it(g: SystemdGuest, inv: str, log: str) -> None:
    assert_stopped_cleanly(g, inv)
    rungs = re.findall(r"ladder rung (\d)", log)
    assert rungs == ["1", "2", "2", "3"], log
    assert re.search(r"\[mule/0 pid \d+\] exited: signal 9 \(SIGKILL\) after SIGKILL$", log,
                     re.MULTILINE), log
    assert "Killing process" not in log, log  # exod's SIGKILL, not systemd's
    assert not exod_processes(g)


def test_stop_stubborn_runner_is_sigkilled_by_exod_before_timeout_stop_sec(
        exod_unit: SystemdGuest) -> None:
    """The shipped TimeoutStopSec (45 s); the short ladder (worst case 3 s) in the config."""
    g = exod_unit
    assert g.show(UNIT, "TimeoutStopUSec") == "45s"
    elapsed, inv, log = stop_stubborn(g)
    assert 3.0 <= elapsed < 45.0, elapsed  # the whole ladder, then exod's own SIGKILL
    assert elapsed < 10, elapsed  # and promptly so
    assert_exod_killed_it(g, inv, log)


def test_stop_ladder_longer_than_timeout_stop_sec_is_extended(
        exod_unit: SystemdGuest, dropin: Callable[[str], None]) -> None:
    """Drop-in TimeoutStopSec=2s, shorter than the ladder's 3 s worst case: exod asks for more
    time (EXTEND_TIMEOUT_USEC with STOPPING=1) and finishes its own ladder; Result=success."""
    g = exod_unit
    dropin("TimeoutStopSec=2s\n")
    assert g.show(UNIT, "TimeoutStopUSec") == "2s"
    elapsed, inv, log = stop_stubborn(g)
    assert elapsed >= 3.0, elapsed  # outlived TimeoutStopSec
    assert "timed out" not in log, log
    assert_exod_killed_it(g, inv, log)


# ---- 6. no orphans -------------------------------------------------------------------------------
def test_kill_9_of_exod_leaves_no_runner(exod_unit: SystemdGuest,
                                         tiny_model_factory: Callable[..., Path]) -> None:
    """A real mlx runner (the tiny model) and a double. Under systemd two mechanisms end them:
    the runners' parent-death signal, and systemd itself, which SIGKILLs what is left in the
    cgroup as soon as the main process is gone (KillMode=mixed sends the final SIGKILL to the
    whole cgroup). Either way nothing may survive."""
    g = exod_unit
    shutil.copytree(tiny_model_factory(layers=4), g.path(f"{TEST_DIR}/tiny"),
                    dirs_exist_ok=True)
    write_config(g, {"real": {"model": f"{TEST_DIR}/tiny"}, "fake": double("cooperative")})
    res = g.systemctl("start", UNIT)  # ready: instances, so both are loaded now
    assert res.returncode == 0, res.stderr
    inv, main_pid = invocation(g), g.show(UNIT, "MainPID")
    runners = pids(wait_status(g, "real, fake ready", all_ready({"real", "fake"})))
    ps = g.run("ps", "-o", "args=", "-p", str(runners["real"])).stdout
    assert " exod.runner --" in ps, ps  # exod.child_start's bootstrap runs the module

    assert g.run("kill", "-9", main_pid).returncode == 0
    g.wait_property(UNIT, "Result", "signal")
    wait_until("the unit's processes gone", lambda: g.show(UNIT, "SubState") == "auto-restart",
               g=g)
    assert not exod_processes(g), exod_processes(g)
    for name, pid in runners.items():
        assert g.run("kill", "-0", str(pid)).returncode != 0, f"runner {name} survived"
    log = journal_of(g, inv)
    assert "Main process exited, code=killed, status=9/KILL" in log, log

