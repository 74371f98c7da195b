"""Where the suite's CPU goes, test by test: `make test-profile` (a pytest plugin, `-p
tests.cpu_profile`).

The integration tier is bound by CPU, not by waiting (a 2-core machine runs 100% busy through
most of it), so its wall time falls only when its CPU-seconds do. pytest's `--durations` counts
wall time, which under xdist mostly says how crowded the machine was; and getrusage loses every
process a test does not reap itself (a runner reaped by its daemon, a daemon killed). A cgroup
counts them all: before each test, the worker moves itself into a cgroup of that test's own, and
everything it then starts (daemons, runners, probes, subprocesses) is counted there, however it
ends. A module's shared daemon is counted with the module's first test.

Needs root and cgroup v1's cpuacct or cgroup v2 (whose cpu.stat every cgroup has), as on Linux CI
machines; elsewhere the plugin says so once and counts nothing. The report: CPU-seconds per
file, then the costliest tests, at the end of the run.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path

import pytest

V1 = Path("/sys/fs/cgroup/cpuacct")
V2 = Path("/sys/fs/cgroup")
NAME = "exod-test-cpu"  # one folder per run's tests, below the hierarchy's root


def _root() -> tuple[Path, str] | None:
    """(folder for the tests' cgroups, the file with their usage), or None where there is none."""
    if (V1 / "cpuacct.usage").exists():
        return V1 / NAME, "cpuacct.usage"
    if (V2 / "cgroup.controllers").exists():
        return V2 / NAME, "cpu.stat"
    return None


def _usage(folder: Path, file: str) -> float:
    text = (folder / file).read_text()
    if file == "cpuacct.usage":
        return int(text) / 1e9  # nanoseconds
    fields = dict(line.split() for line in text.splitlines())
    return int(fields["usage_usec"]) / 1e6


def _folder(nodeid: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", nodeid)[-200:]


def pytest_configure(config: pytest.Config) -> None:
    found = _root()
    if found is None or not os.access(found[0].parent, os.W_OK):
        config.issue_config_time_warning(pytest.PytestWarning(
            "tests.cpu_profile: no writable cpuacct or cgroup v2 hierarchy: nothing counted"), 2)
        return
    # The controller (xdist's main process) starts each run with an empty folder; its workers
    # only add to it.
    if not hasattr(config, "workerinput"):
        found[0].mkdir(exist_ok=True)
        for old in found[0].iterdir():  # a cgroup's folder goes with rmdir, once it is empty
            if old.is_dir():
                try:
                    old.rmdir()
                except OSError:
                    pass  # a process from an earlier run still in it: counted apart, below
    config.stash[_KEY] = found


_KEY = pytest.StashKey[tuple[Path, str]]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    found = item.config.stash.get(_KEY, None)
    if found is not None:
        folder = found[0] / _folder(item.nodeid)
        folder.mkdir(exist_ok=True)
        (folder / "cgroup.procs").write_text(str(os.getpid()))
    yield


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter,
                            config: pytest.Config) -> None:
    found = config.stash.get(_KEY, None)
    if found is None or hasattr(config, "workerinput"):
        return
    ran = {_folder(r.nodeid) for reports in terminalreporter.stats.values() for r in reports
           if hasattr(r, "nodeid")}
    tests = {p.name: _usage(p, found[1]) for p in found[0].iterdir()
             if p.is_dir() and p.name in ran}
    files: Counter[str] = Counter()
    for name, cpu in tests.items():
        files[name.split("__", 1)[0]] += cpu
    write = terminalreporter.write_line
    write(f"\nCPU-seconds, all processes: {sum(tests.values()):.0f} in {len(tests)} tests")
    for name, cpu in files.most_common(25):
        write(f"{cpu:8.1f}  {name}")
    write("costliest tests:")
    for name, cpu in Counter(tests).most_common(15):
        write(f"{cpu:8.1f}  {name}")
