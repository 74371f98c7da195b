"""A slow probe never blocks the daemon: a reload that must probe a new layout runs the probe
off the event loop, so /health and `exoctl status` answer meanwhile, and a running instance is
not disturbed, during the probe or after it. The probe is held back by a double (the real
probe behind a gate the test opens)."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import yaml

from tests.harness import EXOCTL, Daemon


def wait_for_file(path: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def long_extension(fields: dict[str, str]) -> bool:
    """An EXTEND_TIMEOUT_USEC= covering the probe's time limit (the start's own is shorter)."""
    return int(fields.get("EXTEND_TIMEOUT_USEC", "0")) > 120 * 1_000_000


def test_the_daemon_answers_while_a_reload_waits_for_a_slow_probe(
        daemons: Callable[..., Daemon], tiny_model: Path, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    d = daemons({"instances": {"steady": {"model": str(tiny_model)}}},
                env={"EXOD_PROBE_MODULE": "tests.doubles.probe", "EXOD_PROBE_GATE": str(gate),
                     "XDG_CACHE_HOME": str(tmp_path / "cache")})  # nothing probed yet
    d.start()
    pid = d.until_state("steady", "ready")["ranks"][0]["pid"]
    cfg = yaml.safe_load(d.config_path.read_text())
    cfg["instances"]["pair"] = {"model": str(tiny_model), "shards": 2}
    d.write_config(cfg)
    reload = subprocess.Popen([*EXOCTL, "--socket", str(d.socket), "reload"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_file(Path(f"{gate}.started"))  # the probe runs, held at its gate
        with urllib.request.urlopen(d.api_url() + "/health", timeout=10) as r:
            assert r.status == 200
        status = d.ctl("status", "--json", timeout=10)
        assert '"steady"' in status.stdout
        assert d.instance("steady")["state"] == "ready"
        assert reload.poll() is None, "the reload must still be waiting for the probe"
        # The service manager was told the reload may take the probe's time limit.
        d.listener.wait_for(long_extension, timeout=30)
    finally:
        gate.touch()
        out = reload.communicate(timeout=120)[0]
    assert reload.returncode == 0, out
    d.until_state("pair", "ready")
    steady = d.instance("steady")
    assert steady["state"] == "ready" and steady["ranks"][0]["pid"] == pid
    assert d.terminate() == 0


def test_a_first_start_that_probes_extends_the_start_timeout(
        daemons: Callable[..., Daemon], tiny_model: Path, tmp_path: Path) -> None:
    """Before READY, a first probe of a new layout may take longer than the unit's
    TimeoutStartSec (90 s): exod asks the service manager for the probe's time limit first."""
    gate = tmp_path / "gate"
    d = daemons({"instances": {"pair": {"model": str(tiny_model), "shards": 2}}},
                env={"EXOD_PROBE_MODULE": "tests.doubles.probe", "EXOD_PROBE_GATE": str(gate),
                     "XDG_CACHE_HOME": str(tmp_path / "cache")})
    d.start(wait_ready=False)
    try:
        wait_for_file(Path(f"{gate}.started"))
        d.listener.wait_for(long_extension, timeout=30)
        assert not any(f.get("READY") == "1" for f in d.listener.fields())
        # The very first message: exod's own start (imports, config, spawning) may outlast a
        # short TimeoutStartSec on a loaded host, before any readiness tick runs.
        first = d.listener.fields()[0]
        assert set(first) == {"EXTEND_TIMEOUT_USEC"} and int(first["EXTEND_TIMEOUT_USEC"]) > 0
    finally:
        gate.touch()
    d.wait_ready()
    d.until_state("pair", "ready")
    assert d.terminate() == 0
