"""exod's shipped unit under a real systemd 252: offline checks of the file, then start (blocking
until READY=1), STATUS=, stop with Result=success, and exod's lines in the journal."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.system.systemd import (
    CONFIG_PATH,
    SHIPPED_EXOD,
    UNIT_FILE,
    VENV_EXOD,
    SystemdGuest,
    with_venv_exod,
)

pytestmark = pytest.mark.system

DROPIN_EXAMPLE = UNIT_FILE.parent / "exod.service.d" / "notify-reload.conf.example"
MAX_EXPOSURE = 3.0
EXOCTL = str(VENV_EXOD.parent / "exoctl")


def analyze(g: SystemdGuest, *args: str) -> tuple[int, str]:
    """systemd-analyze inside the guest (its temporary files land in the guest's /tmp and /run);
    returns (exit code, stdout + stderr)."""
    res = g.run("systemd-analyze", *args)
    return res.returncode, res.stdout + res.stderr


def stage(g: SystemdGuest, name: str, text: str) -> str:
    """A unit file for systemd-analyze, outside the guest manager's unit path; its guest path."""
    path = g.dir / "analyze" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return f"/run/exod-test/analyze/{name}"


def test_verify_prints_nothing(guest: SystemdGuest) -> None:
    # verify exits 1 for a missing executable, and /usr/bin/exod is where a package puts it, not
    # this checkout: verify a copy whose ExecStart names the venv's exod, nothing else changed.
    code, out = analyze(guest, "verify", stage(guest, "exod.service",
                                                 with_venv_exod(UNIT_FILE.read_text())))
    assert (code, out) == (0, ""), out
    # The shipped file itself may only be blamed for that missing binary.
    code, out = analyze(guest, "verify", stage(guest, "shipped/exod.service",
                                                 UNIT_FILE.read_text()))
    others = [line for line in out.splitlines() if SHIPPED_EXOD not in line]
    assert out and not others, out


def test_notify_reload_dropin_is_only_for_253(guest: SystemdGuest) -> None:
    """The drop-in example parses cleanly except for what systemd 252 does not know."""
    unit = stage(guest, "dropin/exod.service", with_venv_exod(UNIT_FILE.read_text()))
    stage(guest, "dropin/exod.service.d/notify-reload.conf", DROPIN_EXAMPLE.read_text())
    code, out = analyze(guest, "verify", unit)
    version = int(guest.run("systemctl", "--version").stdout.split()[1])
    if version >= 253:
        assert (code, out) == (0, ""), out
    else:
        unknown = [line for line in out.splitlines()
                   if "notify-reload" not in line and "ReloadSignal" not in line]
        assert out and not unknown, out


def test_security_exposure(guest: SystemdGuest) -> None:
    _, out = analyze(guest, "security", "--offline=true", "--no-pager",
                        stage(guest, "security/exod.service",
                              with_venv_exod(UNIT_FILE.read_text())))
    m = re.search(r"Overall exposure level for exod\.service: (\d+\.\d+)", out)
    assert m, out
    score = float(m.group(1))
    print(f"systemd-analyze security exposure of {UNIT_FILE.name}: {score}")
    assert score <= MAX_EXPOSURE, out


def test_guest_sees_only_its_own_units(guest: SystemdGuest) -> None:
    """The harness's safety promise: no host unit folder, generator or host unit is visible."""
    assert guest.show("exod-test.target", "ActiveState") == "active"
    unit_path = guest.run("systemctl", "show", "--property=UnitPath", "--value").stdout.split()
    assert unit_path == ["/run/exod-test/units"]
    files = guest.systemctl("list-unit-files", "--no-legend").stdout.split("\n")
    names = {line.split()[0] for line in files if line.strip()}
    assert "multi-user.target" not in names and "systemd-tmpfiles-setup.service" not in names
    assert names <= {p.name for p in guest.units.iterdir()}, names


def test_start_status_stop_journal(exod_unit: SystemdGuest) -> None:
    g = exod_unit
    res = g.systemctl("start", "exod.service")
    assert res.returncode == 0, res.stderr
    # Type=notify: `systemctl start` returned only after READY=1, so the unit is already active.
    props = g.properties("exod.service", "ActiveState", "SubState", "MainPID", "StatusText",
                         "WatchdogUSec", "NotifyAccess")
    assert (props["ActiveState"], props["SubState"]) == ("active", "running"), props
    assert props["NotifyAccess"] == "main"
    # STATUS= is exod's one-line summary; the double becomes ready within moments.
    assert re.fullmatch(r"\d+/1 ready(; .*)?", props["StatusText"]), props
    g.wait_property("exod.service", "StatusText", "1/1 ready", timeout=30)
    assert 'Status: "1/1 ready"' in g.systemctl("status", "exod.service").stdout

    pid = props["MainPID"]
    user = g.run("ps", "-o", "user=", "-p", pid).stdout.strip()
    assert user == "exod", "the service must run as the sysusers-created user"
    assert g.run("pgrep", "-u", "exod", "-f", "tests.doubles.runner").returncode == 0

    res = g.systemctl("stop", "exod.service")
    assert res.returncode == 0, res.stderr
    after = g.properties("exod.service", "ActiveState", "Result", "ExecMainStatus")
    assert after == {"ActiveState": "inactive", "Result": "success", "ExecMainStatus": "0"}
    # KillMode=mixed: exod's own ladder stopped the runner; nothing was left for SIGKILL.
    assert g.run("pgrep", "-f", "tests.doubles.runner").returncode == 1

    log = g.wait_journal("exod.service", "exod stopped")
    for line in (f"exod 0.1.0 pid {pid}: 1 instance(s) from /etc/exod/exod.yaml",
                 "watchdog: pinging every 15.0s",  # WatchdogSec=30 reached exod
                 "double cooperative: ready",  # the runner's own stderr, through exod
                 "SIGTERM: stopping every instance",
                 "ladder rung 1: asking to shut down"):
        assert line in log, log
    # Under systemd exod writes journal priority prefixes, not its own timestamps.
    assert not re.search(r"^\d{4}-\d\d-\d\d ", log, re.MULTILINE), log


def test_real_runner_loads_under_the_hardening(exod_unit: SystemdGuest,
                                                tiny_model_factory: Callable[..., Path]) -> None:
    """mlx itself (not a double) under every hardening option of the unit, with `ready:
    instances`: `systemctl start` returns once the model is loaded."""
    g = exod_unit
    shutil.copytree(tiny_model_factory(layers=4), g.path("/var/lib/exod-test/tiny"),
                    dirs_exist_ok=True)
    g.write(CONFIG_PATH, "ready: instances\ninstances:\n  tiny:\n"
                         "    model: /var/lib/exod-test/tiny\n")
    res = g.systemctl("start", "exod.service")
    assert res.returncode == 0, res.stderr
    assert g.show("exod.service", "StatusText") == "1/1 ready"
    res = g.systemctl("stop", "exod.service")
    assert res.returncode == 0, res.stderr
    assert g.show("exod.service", "Result") == "success"
    log = g.wait_journal("exod.service", "exod stopped")
    assert "loaded 4 layers" in log and "ladder rung 1" in log, log
    assert "ladder rung 2" not in log, log


def test_exoctl_reaches_the_service(exod_unit: SystemdGuest) -> None:
    g = exod_unit
    assert g.systemctl("start", "exod.service").returncode == 0
    g.wait_property("exod.service", "StatusText", "1/1 ready", timeout=30)
    # As root, exoctl looks at /run/exod/control.sock, the unit's RuntimeDirectory.
    res = g.run(EXOCTL, "status")
    assert res.returncode == 0, res.stderr
    assert "fake" in res.stdout and "ready" in res.stdout
