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
    finally:
        gate.touch()
        out = reload.communicate(timeout=120)[0]
    assert reload.returncode == 0, out
    d.until_state("pair", "ready")
    steady = d.instance("steady")
    assert steady["state"] == "ready" and steady["ranks"][0]["pid"] == pid
    assert d.terminate() == 0
