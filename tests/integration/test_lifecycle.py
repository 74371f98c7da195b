"""End to end with real processes and the real runner on a tiny real model: start, progress,
ready, status, stop through rung 1 only, clean exit."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from collections.abc import Callable


from tests.harness import Daemon, pid_alive


def test_start_load_ready_status_stop(daemons: Callable[..., Daemon],
                                      tiny_model_factory: Callable[..., Path]) -> None:
    model = tiny_model_factory(layers=12)
    d = daemons({"instances": {"tiny": {"model": str(model)}}})
    d.start()

    # Progress is observed layer by layer through `wait`, then ready.
    progress = [m for m in d.stream({"cmd": "wait", "name": "tiny"})]
    final = progress.pop()
    assert final["ok"] is True, final
    seen = [m["instance"]["ranks"][0]["layers_loaded"] for m in progress]
    seen.append(final["instance"]["ranks"][0]["layers_loaded"])
    assert seen == sorted(seen), seen
    assert seen[-1] == 12
    assert len(set(seen)) > 2, f"expected to see layers rise, saw {seen}"

    res = d.ctl("status", "--json")
    snap = json.loads(res.stdout)
    assert snap["daemon"]["pid"] == d.proc.pid
    assert snap["daemon"]["version"]
    assert snap["daemon"]["uptime_s"] >= 0
    (inst,) = snap["instances"]
    assert inst["name"] == "tiny" and inst["state"] == "ready"
    assert inst["model"] == str(model) and inst["restarts"] == 0
    (rank,) = inst["ranks"]
    assert rank["rank"] == 0 and rank["state"] == "ready"
    assert rank["layers_loaded"] == rank["layers_total"] == 12
    assert rank["rss_bytes"] > 10 * 2**20
    assert rank["last_exit"] is None
    runner = rank["pid"]
    assert pid_alive(runner)

    table = d.ctl("status").stdout
    assert "tiny" in table and "ready" in table and "12/12" in table and str(runner) in table

    assert d.terminate(signal.SIGTERM) == 0
    assert not pid_alive(runner)
    steps = [e["extra"]["step"] for e in d.events(event="ladder")]
    assert steps == ["ask"], f"runner must leave at rung 1, ladder steps: {steps}"
    (exit_ev,) = d.events(event="exit")
    assert exit_ev["extra"]["code"] == 0 and exit_ev["extra"]["signals_sent"] == ["ask"]


def test_not_running_is_exit_3(tmp_path: Path) -> None:
    from tests.harness import EXOCTL
    import subprocess

    res = subprocess.run([*EXOCTL, "--socket", str(tmp_path / "nope.sock"), "status"],
                         capture_output=True, text=True, check=False)
    assert res.returncode == 3
    assert "not running" in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_wait_with_a_timeout_also_waits_for_the_daemon_to_start(
        daemons: Callable[..., Daemon], tiny_model: Path) -> None:
    """`exoctl wait NAME --timeout S` run before exod is up (as right after `make run`)."""
    import subprocess

    from tests.harness import EXOCTL

    d = daemons({"instances": {"tiny": {"model": str(tiny_model)}}})
    waiter = subprocess.Popen([*EXOCTL, "--socket", str(d.socket), "wait", "tiny",
                               "--timeout", "120"], stdout=subprocess.PIPE, text=True)
    d.start(wait_ready=False)  # only now does the socket appear
    out, _ = waiter.communicate(timeout=150)
    assert waiter.returncode == 0 and "tiny: ready" in out
    res = subprocess.run([*EXOCTL, "--socket", str(d.dir / "nope.sock"), "wait", "tiny",
                          "--timeout", "0.5"], capture_output=True, text=True, check=False)
    assert res.returncode == 4 and "not ready after 0.5s" in res.stderr
