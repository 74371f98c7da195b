"""The guest harness keeps its promises: it leaves no process or cgroup behind, even when the
test run itself is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import REPO, pid_alive, wait_pid_gone
from tests.system.systemd import GuestUnavailable, SystemdGuest, probe_unshare

pytestmark = pytest.mark.system


@pytest.fixture(autouse=True)
def _namespaces_allowed() -> None:
    try:
        probe_unshare()
    except GuestUnavailable as e:
        pytest.skip(str(e))


def test_exit_stops_the_guest_and_removes_its_cgroups(tmp_path: Path) -> None:
    with SystemdGuest(tmp_path) as g:
        assert g.boot_seconds < 5, g.boot_seconds
        pid1, cgroup = g.pid, g.cgroup
        assert (cgroup / "init.scope").is_dir()
    assert not pid_alive(pid1)
    assert not cgroup.exists()
    assert "Exiting container." in g.console()


def test_kill_fallback_then_exit_cleans_up(tmp_path: Path) -> None:
    g = SystemdGuest(tmp_path).start()
    pid1, cgroup = g.pid, g.cgroup
    g.kill()
    g.exit()
    assert not pid_alive(pid1)
    assert not cgroup.exists()


BOOT_AND_HANG = """
import sys, time
from pathlib import Path
from tests.system.systemd import SystemdGuest
g = SystemdGuest(Path(sys.argv[1])).start()
print(g.pid, g.cgroup, flush=True)
time.sleep(600)
"""


def test_a_killed_harness_takes_its_guest_down(tmp_path: Path) -> None:
    """PR_SET_PDEATHSIG on unshare + --kill-child: SIGKILL of the test process kills the guest;
    only an empty cgroup folder remains, and the next guest's start removes it."""
    proc = subprocess.Popen([sys.executable, "-c", BOOT_AND_HANG, str(tmp_path / "a")],
                            cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        pid1_text, cgroup_text = proc.stdout.readline().split()
        pid1, cgroup = int(pid1_text), Path(cgroup_text)
        assert pid_alive(pid1) and cgroup.is_dir()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert wait_pid_gone(pid1, timeout=10), "the guest outlived its harness"
    assert cgroup.is_dir(), "the dead harness could not have removed its cgroup"
    assert not (cgroup / "cgroup.procs").read_text().strip()

    with SystemdGuest(tmp_path / "b"):
        assert not cgroup.exists(), "a stale cgroup must be removed by the next start"
    assert os.path.isdir(cgroup.parent)
