"""Fixtures for system tests: a real systemd booted in private namespaces (tests/system/systemd.py).

`guest` is one bare guest per test module (boots in ~0.1 s); `exod_guest` is a guest where exod is
installed as a package would install it (sysusers entry, the shipped unit, a config). A machine
that refuses the namespaces (unshare: EPERM) skips these tests, saying so; nothing else skips.
When a test fails, its report carries the guest's console, units and exod's journal.
"""

from __future__ import annotations

import subprocess
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.system.systemd import (
    CONFIG_PATH,
    GuestError,
    GuestUnavailable,
    SystemdGuest,
    double_config,
    install_exod,
)


def _boot(tmp: Path) -> SystemdGuest:
    g = SystemdGuest(tmp)
    try:
        g.start()
    except GuestUnavailable as e:
        g.exit()
        pytest.skip(str(e))
    except BaseException:
        g.exit()
        raise
    return g


@pytest.fixture(scope="module")
def guest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SystemdGuest]:
    g = _boot(tmp_path_factory.mktemp("guest"))
    try:
        yield g
    finally:
        g.exit()


@pytest.fixture(scope="module")
def exod_guest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SystemdGuest]:
    """A guest with exod installed and a config of one cooperative runner double."""
    g = _boot(tmp_path_factory.mktemp("exod-guest"))
    try:
        install_exod(g, double_config("cooperative"))
        yield g
    finally:
        g.exit()


@pytest.fixture
def exod_unit(exod_guest: SystemdGuest) -> Iterator[SystemdGuest]:
    """exod_guest for one test, which may rewrite the config: afterwards exod.service is
    stopped, its failure state cleared and the default config back."""
    yield exod_guest
    if exod_guest.alive:
        exod_guest.systemctl("stop", "exod.service")
        exod_guest.systemctl("reset-failed", "exod.service")
        exod_guest.write(CONFIG_PATH, double_config("cooperative"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                               call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    funcargs = getattr(item, "funcargs", {})
    for name in ("exod_unit", "exod_guest", "guest"):
        g = funcargs.get(name)
        if isinstance(g, SystemdGuest):
            try:
                report.sections.append(("systemd guest", g.diagnostics("exod.service")))
            except (OSError, subprocess.SubprocessError, GuestError) as e:
                # diagnostics must never hide the real failure
                report.sections.append(("systemd guest", f"(no diagnostics: {e})"))
            return
