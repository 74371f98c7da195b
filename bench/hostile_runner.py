"""A hostile runner (issue #8): how much a runner flooding its channel with valid lifecycle
frames slows the daemon down, against the same daemon before the flood, in the same run.

The daemon serves one well-behaved instance ("calm", a cooperative runner double); then
`exoctl start storm` starts a runner double that sends heartbeat and status frames as fast as
it can. Measured before and during the storm: `/health` p50 (100 requests), `exoctl status`
p50 (5 runs), and the daemon's RSS.

Goals: /health ≤ 10x and exoctl status ≤ 5x (the daemon still reads every frame of the storm,
on a CPU it shares with it: fairness, not immunity); RSS ≤ 1.5x.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path

from bench.common import report
from bench.results import Figure
from bench.daemon import rss_mb
from bench.security import health_p50, status_p50
from tests.harness import EXOCTL, Daemon


def main() -> None:
    import bench.security as sec
    sec.PROBES = 100
    fake = Path(tempfile.mkdtemp(prefix="bench-model-"))
    (fake / "config.json").write_text('{"model_type": "llama", "num_hidden_layers": 4}')
    d = Daemon({"instances": {
        "calm": {"model": str(fake), "env": {"EXOD_DOUBLE": "cooperative"}},
        "storm": {"model": str(fake), "env": {"EXOD_DOUBLE": "storm"}, "autostart": False},
    }}, name="bench")
    try:
        d.start()
        d.until_state("calm", "ready")
        assert d.proc is not None
        host, port = "127.0.0.1", int(d.api_url().rsplit(":", 1)[1])
        base_health, base_status, base_rss = health_p50(host, port), status_p50(d), rss_mb(
            d.proc.pid)
        subprocess.run([*EXOCTL, "--socket", str(d.socket), "start", "storm"], check=True,
                       capture_output=True)
        d.until_state("storm", "ready")
        time.sleep(2)  # let the storm reach full strength (a measurement, not a synchronisation)
        storm_health, storm_status = health_p50(host, port), status_p50(d)
        storm_rss = rss_mb(d.proc.pid)
    finally:
        d.close()
    h, st, r = storm_health / base_health, storm_status / base_status, storm_rss / base_rss
    report("hostile runner: a daemon whose runner floods its channel", [
        Figure("/health p50, storm / calm", h, goal="<= 10x",
               sides={"storm": storm_health * 1e3, "calm": base_health * 1e3}, side_unit="ms"),
        Figure("exoctl status p50, storm / calm", st, goal="<= 5x",
               sides={"storm": storm_status * 1e3, "calm": base_status * 1e3}, side_unit="ms"),
        Figure("daemon RSS, storm / calm", r, goal="<= 1.5x",
               sides={"storm": storm_rss, "calm": base_rss}, side_unit="MB"),
    ])


if __name__ == "__main__":
    main()
