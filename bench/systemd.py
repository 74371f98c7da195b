"""exod under a real systemd 252 (booted in private namespaces by tests/system/systemd.py), driving
the shipped unit adapted only in paths, exactly as the system tests do.

What is measured, and how. The guest has no time namespace, so the host's CLOCK_MONOTONIC (Python's
time.monotonic) is the clock of systemd's *TimestampMonotonic properties (µs): one timeline for
the client's wall time and systemd's own record of the unit, phase by phase.

(a) Readiness overhead: `systemctl start exod` wall time against the daemon's own start → READY
        daemon = ActiveEnterTimestampMonotonic − ExecMainStartTimestampMonotonic
    i.e. from systemd's fork of exod's main process to the moment systemd processed its READY=1
    and made the unit active: interpreter start, imports, config, sockets, runner spawns (and,
    under `ready: instances`, the runners' loads). The rest of the wall time is split into
        before = ExecMainStart − call    (nsenter + systemctl start-up, the job, the fork)
        after  = return − ActiveEnter    (the job's end reaching systemctl, both exiting)
    and compared with an in-run baseline: a `systemctl show` round trip through the same nsenter
    (no job), measured right before each start. Both ready policies: `daemon` with one runner
    double, `instances` with 8 real tiny-model runners.
(b) `systemctl stop exod` wall time with 8 ready instances of a real tiny model. Goal ≤ 1.5 s,
    with zero SIGKILLs. Against exod's own part:
        daemon = ExecMainExitTimestampMonotonic − ActiveExitTimestampMonotonic
    (SIGTERM sent → exod exited, its 8 ladders done). SIGKILLs are counted in the journal of each
    run: exod's "ladder rung 3" lines and systemd's "Killing process" lines; every runner must
    leave at rung 1.

Needs what the system tests need (root, namespaces); says so and returns if the machine refuses.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import median, model, report, Row
from bench.results import Figure
from tests.system.systemd import (
    CONFIG_PATH,
    GuestUnavailable,
    SystemdGuest,
    install_exod,
)

UNIT = "exod.service"
N = 8
TINY = "/var/lib/exod-test/tiny"
FAKE = "/var/lib/exod-test/fake-model"  # written by install_exod
STOP_GOAL = 1.5


@dataclass
class Phases:
    wall: float  # the client's whole call
    before: float  # call → systemd's first step for the unit (fork / SIGTERM)
    daemon: float  # exod's own part (fork → READY, or SIGTERM → exit)
    after: float  # systemd's last step → the call returned
    client: float  # baseline: a `systemctl show` round trip just before


def config(ready: str, instances: dict[str, dict[str, object]]) -> str:
    return json.dumps({"ready": ready, "api": {"listen": ""}, "instances": instances}) + "\n"


def double() -> dict[str, object]:
    return {"model": FAKE, "env": {"EXOD_DOUBLE": "cooperative"}}


def seconds(g: SystemdGuest, *props: str) -> list[float]:
    got = g.properties(UNIT, *props)
    values = [int(got[p]) / 1e6 for p in props]
    assert all(values), f"{UNIT} has no {props} (was it garbage-collected?): {got}"
    return values


def client_round_trip(g: SystemdGuest) -> float:
    t = time.monotonic()
    g.systemctl("show", UNIT, "--property=Id", check=True)
    return time.monotonic() - t


def start(g: SystemdGuest) -> Phases:
    # StartLimitBurst=5 counts every start, a benchmark's too: re-arm it first.
    g.systemctl("reset-failed", UNIT, check=True)
    client = client_round_trip(g)
    t0 = time.monotonic()
    g.systemctl("start", UNIT, check=True)
    t1 = time.monotonic()
    fork, ready = seconds(g, "ExecMainStartTimestampMonotonic", "ActiveEnterTimestampMonotonic")
    return Phases(t1 - t0, fork - t0, ready - fork, t1 - ready, client)


def stop(g: SystemdGuest) -> tuple[Phases, str]:
    """The phases of `systemctl stop`, and the journal of the run that it ended."""
    inv = g.show(UNIT, "InvocationID")
    client = client_round_trip(g)
    t0 = time.monotonic()
    g.systemctl("stop", UNIT, check=True)
    t1 = time.monotonic()
    term, exited = seconds(g, "ActiveExitTimestampMonotonic", "ExecMainExitTimestampMonotonic")
    assert g.show(UNIT, "Result") == "success"
    log = ""
    for _ in range(200):  # journald reads the service's stream asynchronously
        log = g.run("journalctl", "--no-pager", "-q", "-o", "cat",
                    f"_SYSTEMD_INVOCATION_ID={inv}", "+", f"INVOCATION_ID={inv}").stdout
        if "exod stopped" in log:
            break
        time.sleep(0.05)
    return Phases(t1 - t0, term - t0, exited - term, t1 - exited, client), log


def ms(x: float) -> str:
    return f"{x * 1000:.0f} ms"


def rows(label: str, runs: list[Phases], own: str) -> list[Row]:
    """Medians over the runs; the overhead and the ratio are taken per run first (the phases of
    one run add up exactly; medians of separate phases need not)."""
    m = median
    wall, daemon, client = (m([getattr(r, f) for r in runs]) for f in ("wall", "daemon", "client"))
    ratio = m([r.wall / r.daemon for r in runs])
    over = m([r.before + r.after for r in runs])
    before, after = m([r.before for r in runs]), m([r.after for r in runs])
    return [Figure(f"{label}: wall / exod's own {own}", ratio,
                   sides={"wall": wall * 1e3, own: daemon * 1e3}, side_unit="ms"),
            Figure(f"{label}: systemd + client", over * 1e3, unit="ms",
                   text=f"{over / client:.2f}x a `systemctl show` round trip ({ms(client)}); "
                        f"before exod {ms(before)}, after {ms(after)}")]


def main(rounds: int = 5, stop_rounds: int = 3) -> None:
    tiny = model("tiny-4")
    with tempfile.TemporaryDirectory(prefix="exod-bench-systemd-") as tmp:
        g = SystemdGuest(Path(tmp))
        try:
            g.start()
        except GuestUnavailable as e:
            g.exit()
            print(f"\n== systemd: skipped: {e}")
            return
        try:
            run(g, tiny, rounds, stop_rounds)
        finally:
            g.exit()


def run(g: SystemdGuest, tiny: Path, rounds: int, stop_rounds: int) -> None:
    install_exod(g)  # also enabled: the unit stays loaded, so its timestamps stay readable
    shutil.copytree(tiny, g.path(TINY), dirs_exist_ok=True)

    g.write(CONFIG_PATH, config("daemon", {"fake": double()}))
    daemon_starts = []
    for _ in range(rounds):
        daemon_starts.append(start(g))
        stop(g)

    g.write(CONFIG_PATH, config("instances", {f"m{i}": {"model": TINY} for i in range(N)}))
    inst_starts, stops, rungs, killed = [], [], [], 0
    for _ in range(stop_rounds):
        inst_starts.append(start(g))
        status = g.show(UNIT, "StatusText")
        assert status == f"{N}/{N} ready", status
        phases, log = stop(g)
        assert log.count("exited: exit code 0") == N, log
        stops.append(phases)
        rungs += re.findall(r"ladder rung (\d)", log)
        killed += log.count("Killing process")

    version = g.run("systemctl", "--version").stdout.split()[1]
    report(f"systemd {version}: `systemctl start` ({rounds} × `ready: daemon`, 1 runner double; "
           f"{stop_rounds} × `ready: instances`, {N} tiny-model runners)",
           rows("ready: daemon", daemon_starts, "fork → READY")
           + rows("ready: instances", inst_starts, "fork → READY"))
    walls = [s.wall for s in stops]
    sw = median(walls)
    extra = [r for r in rungs if r != "1"]
    rung_text = (f"{len(rungs)}: rung 1 × {rungs.count('1')} ({N} × {stop_rounds} expected), "
                 f"others {extra or 0}")
    report(f"systemd {version}: `systemctl stop` with {N} ready tiny-model instances, "
           f"{stop_rounds} rounds",
           [*rows("stop", stops, "SIGTERM → exit"),
            Figure("stop: slowest of the rounds", max(walls), unit="s", text=f"median {ms(sw)}",
                   goal=f"<= {STOP_GOAL} s"),
            ("ladder rungs in the journal", rung_text),
            Figure("SIGKILLs (exod's rung 3 + systemd's)", rungs.count("3") + killed, unit="",
                   goal="== 0", met=not extra and not killed)])


if __name__ == "__main__":
    main()
