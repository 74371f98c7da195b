"""A model named by hub repository under a real systemd: the shipped unit with TimeoutStartSec=1s
and `ready: instances` starts while a throttled download takes many times that, because exod
extends the start timeout while the model downloads; STATUS= shows the download, then the unit
is active. The hub is olah on the host (tests/hub.py), so this guest shares the host's network.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from exod.daemon.readiness import TICK
from tests.hub import Throttle, serving
from tests.system.systemd import CONFIG_PATH, GuestUnavailable, SystemdGuest, install_exod

pytestmark = pytest.mark.system

UNIT = "exod.service"
BOUND = 120.0


@pytest.fixture(scope="module")
def throttle(tmp_path_factory: pytest.TempPathFactory,
             tiny_model_factory: Callable[..., Path]) -> Iterator[Throttle]:
    with serving(tmp_path_factory.mktemp("hub"), tiny_model_factory) as (_, t, _):
        yield t


@pytest.fixture(scope="module")
def host_net_guest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SystemdGuest]:
    """A guest in the host's network namespace (so it reaches olah), exod installed."""
    g = SystemdGuest(tmp_path_factory.mktemp("hub-guest"), host_network=True)
    try:
        g.start()
    except GuestUnavailable as e:  # as tests/system/conftest.py: the machine refuses namespaces
        g.exit()
        pytest.skip(str(e))
    try:
        install_exod(g)
        yield g
    finally:
        g.exit()


def test_a_slow_download_outlives_timeout_start_sec(host_net_guest: SystemdGuest,
                                                    throttle: Throttle) -> None:
    g = host_net_guest
    throttle.rate = 250_000  # ~14 s for the model: several ticks past TimeoutStartSec=1s
    g.install_dropin(UNIT, "test-hub", "[Service]\nTimeoutStartSec=1s\n"
                     f"Environment=HF_ENDPOINT={throttle.url}\n")
    g.daemon_reload()
    assert g.show(UNIT, "TimeoutStartUSec") == "1s"
    g.write(CONFIG_PATH, json.dumps({
        "ready": "instances", "api": {"listen": ""},
        "instances": {"a": {"model": "hf:org/tiny", "env": {"EXOD_DOUBLE": "cooperative"}}},
    }) + "\n")
    seen: list[str] = []
    t = time.monotonic()
    start = g.popen("systemctl", "start", UNIT)
    try:
        while start.poll() is None and time.monotonic() - t < BOUND:
            text = g.show(UNIT, "StatusText")
            if not seen or seen[-1] != text:
                seen.append(text)
            time.sleep(0.2)  # sampling what `systemctl status` shows, not waiting for it
        _, err = start.communicate(timeout=BOUND)
    finally:
        if start.poll() is None:
            start.kill()
    elapsed = time.monotonic() - t
    assert start.returncode == 0, (err, seen, g.diagnostics(UNIT))
    assert elapsed > 2 * TICK, f"the start took only {elapsed:.2f}s: it proves nothing"
    assert any(s.startswith("0/1 ready; a: downloading ") and "kB/s)" in s for s in seen), seen
    assert g.properties(UNIT, "ActiveState", "StatusText") == {
        "ActiveState": "active", "StatusText": "1/1 ready"}
    assert g.path("/var/lib/exod/hub/models--org--tiny/refs/main").exists()
    g.systemctl("stop", UNIT)
