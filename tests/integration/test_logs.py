"""Log lines fit where exod runs: journal priority prefixes under systemd, time-stamped
human lines elsewhere; each names instance, rank and pid."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import yaml

from tests.harness import DOUBLES_ENV, EXOD, NotifyListener
from tests.integration.conftest import double_env

STAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")


def run_daemon(tmp_path: Path, fake_model: Path, journal: bool) -> list[str]:
    cfg = tmp_path / "exod.yaml"
    cfg.write_text(yaml.safe_dump({
        "control": {"socket": str(tmp_path / "c.sock")},
        # A port the kernel picks: this module's two tests may run at once on two workers.
        "api": {"listen": "127.0.0.1:0"},
        "instances": {"crashy": {"model": str(fake_model), "env": double_env("crash"),
                                 "restart": "no"}}}))
    log = tmp_path / "log"
    listener = NotifyListener(tmp_path / "m.sock")
    with open(log, "wb") as f:
        env = {**os.environ, "NOTIFY_SOCKET": str(listener.path), **DOUBLES_ENV}
        env.pop("JOURNAL_STREAM", None)
        if journal:  # what systemd sets when stderr is connected to journald
            st = os.fstat(f.fileno())
            env["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"
        proc = subprocess.Popen([*EXOD, "run", "-c", str(cfg)], stderr=f, stdout=f, env=env)
        try:
            # Ready, then wait for the crash to be handled: STATUS says the instance failed.
            listener.wait_for(lambda m: "crashy: failed" in m.get("STATUS", ""))
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0
        finally:
            proc.kill()
            listener.close()
    return log.read_text().splitlines()


def test_journal_lines_have_priority_prefixes(tmp_path: Path, fake_model: Path) -> None:
    lines = run_daemon(tmp_path, fake_model, journal=True)
    assert lines and all(re.match(r"<[0-7]>", line) for line in lines), lines
    assert not any(STAMP.search(line) for line in lines), "the journal adds its own time"
    assert any(line.startswith("<6>") for line in lines)
    # The runner's own `<3>` line keeps its priority, with the instance/rank/pid prefix.
    assert any(re.match(r"<3>\[crashy/0 pid \d+\] \| double: crashing", line) for line in lines)
    assert any(line.startswith("<3>[crashy/0 pid") and "exited unexpectedly" in line
               for line in lines)


def test_human_lines_elsewhere(tmp_path: Path, fake_model: Path) -> None:
    lines = run_daemon(tmp_path, fake_model, journal=False)
    assert all(STAMP.match(line) for line in lines), lines[:3]
    assert not any(line.startswith("<") for line in lines)
    assert any("ERROR" in line and "[crashy/0 pid" in line for line in lines)
