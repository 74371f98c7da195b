"""A model named by hub repository under a real systemd: the shipped unit with TimeoutStartSec=2s
and `ready: instances` starts while a throttled download takes many times that, because exod
extends the start timeout while the model downloads; STATUS= shows the download, then the unit
is active. The hub is olah on the host (tests/hub.py), so this guest shares the host's network.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from exod.daemon.readiness import TICK
from tests.harness import free_port
from tests.hub import Throttle, serving
from tests.system.systemd import (
    CONFIG_PATH,
    VENV_EXOD,
    GuestUnavailable,
    SystemdGuest,
    install_exod,
)

pytestmark = pytest.mark.system

UNIT = "exod.service"
BOUND = 120.0
EXOCTL = str(VENV_EXOD.parent / "exoctl")


def wait_status(g: SystemdGuest, what: str, pred: Callable[[dict[str, Any]], bool],
                timeout: float) -> dict[str, Any]:
    """`exoctl status --json` in the guest, polled until `pred` holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        res = g.run(EXOCTL, "--socket", "/run/exod/control.sock", "status", "--json")
        if res.returncode == 0 and pred(snap := json.loads(res.stdout)):
            return snap
        time.sleep(0.1)  # polling exoctl, not waiting for time to pass
    raise AssertionError(f"not within {timeout}s: {what}\n{g.diagnostics(UNIT)}")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, tiny_model_factory: Callable[..., Path]
           ) -> Iterator[tuple[Throttle, dict[str, str]]]:
    with serving(tmp_path_factory.mktemp("hub"), tiny_model_factory) as (_, t, commits):
        yield t, commits


@pytest.fixture
def throttle(served: tuple[Throttle, dict[str, str]]) -> Iterator[Throttle]:
    t = served[0]
    yield t
    t.rate = None


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
    throttle.rate = 250_000  # ~14 s for the model: several ticks past TimeoutStartSec=2s
    g.install_dropin(UNIT, "test-hub", "[Service]\nTimeoutStartSec=2s\n"
                     f"Environment=HF_ENDPOINT={throttle.url}\n")
    g.daemon_reload()
    assert g.show(UNIT, "TimeoutStartUSec") == "2s"
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
    assert any(s.startswith("0/1 ready; a: downloading ") and "B/s)" in s for s in seen), seen
    assert g.properties(UNIT, "ActiveState", "StatusText") == {
        "ActiveState": "active", "StatusText": "1/1 ready"}
    assert g.path("/var/lib/exod/hub/models--org--tiny/refs/main").exists()
    g.systemctl("stop", UNIT)


def test_stop_mid_download_then_start_resumes_loads_and_chats(
        host_net_guest: SystemdGuest, throttle: Throttle,
        served: tuple[Throttle, dict[str, str]]) -> None:
    """The issue's end to end under systemd, with the real runner: a hub name in exod.yaml,
    `systemctl start`, the download in `exoctl status`; `systemctl stop` mid-download ends the
    fetcher at rung 1 and keeps the partial file; the next start resumes it (a Range request),
    loads and chats."""
    g = host_net_guest
    commit = served[1]["v1"]  # not the revision the other test fetched
    throttle.rate = 150_000
    port = free_port()
    g.install_dropin(UNIT, "test-hub", f"[Service]\nEnvironment=HF_ENDPOINT={throttle.url}\n")
    g.daemon_reload()
    g.write(CONFIG_PATH, json.dumps({
        "ready": "instances", "api": {"listen": f"127.0.0.1:{port}"},
        "instances": {"a": {"model": f"hf:org/tiny@{commit}"}}}) + "\n")
    g.systemctl("start", "--no-block", UNIT, check=True)
    seen = wait_status(g, "bytes on disk", lambda s: (s["instances"][0]["download"] or {}).get(
        "done_bytes", 0) > 200_000, timeout=BOUND)
    assert seen["instances"][0]["detail"].startswith("downloading "), seen
    g.systemctl("stop", UNIT, check=True)
    fetcher = [line for line in g.journal(UNIT).splitlines() if "fetcher of" in line]
    assert any("asking" in line for line in fetcher), fetcher
    assert not any("SIGTERM" in line or "SIGKILL" in line for line in fetcher), fetcher
    blobs = g.path("/var/lib/exod/hub/models--org--tiny/blobs")
    assert any(p.stat().st_size > 0 for p in blobs.glob("*.incomplete"))

    throttle.rate, throttle.ranges = None, []
    g.systemctl("start", UNIT, check=True, timeout=BOUND)  # ready: instances: once loaded
    assert any(r.startswith("bytes=") and not r.startswith("bytes=0-")
               for r in throttle.ranges), throttle.ranges
    journal = g.journal(UNIT)
    for step in ("downloading → starting", "starting → loading", "loading → ready"):
        assert step in journal, journal[-3000:]
    reply = json.loads(urllib.request.urlopen(urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions", json.dumps(
            {"model": "a", "prompt": "def", "max_tokens": 4}).encode(),
        {"Content-Type": "application/json"}), timeout=BOUND).read())
    assert reply["usage"]["completion_tokens"] >= 1
    g.systemctl("stop", UNIT)
