"""`exoctl logs`: a runner's recent output from the daemon's in-memory rings, per rank, and
`-f` following new lines live; `exoctl` shell completion of instance names."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

from tests.harness import EXOCTL, SAFETY, Daemon
from tests.integration.conftest import double_env


def two_ranks(daemons: Callable[..., Daemon], fake_model: Path) -> Daemon:
    d = daemons({"instances": {
        "pair": {"model": str(fake_model), "shards": 2, "env": double_env("cooperative")},
        "other": {"model": str(fake_model), "env": double_env("cooperative")}}})
    d.start()
    d.until_instance("pair", lambda i: i["state"] == "ready" and all(
        r["state"] == "ready" for r in i["ranks"]), what="pair ready")
    return d


def test_logs_tail_per_rank_and_follow(daemons: Callable[..., Daemon], fake_model: Path) -> None:
    d = two_ranks(daemons, fake_model)
    d.watch_until(lambda s: all(i["state"] == "ready" for i in s["instances"]),
                  what="both ready")
    # The runner's line is logged before READY reaches the status, but from another socket:
    # wait for the line itself through the follow stream (an event, not a poll).
    for rank in (0, 1):
        for msg in d.stream({"cmd": "logs", "name": "pair", "rank": rank, "lines": 50,
                             "follow": True}):
            if "ready" in msg.get("text", ""):
                break
    out = d.ctl("logs", "pair").stdout.splitlines()
    assert any(line.startswith(tuple(f"{h}" for h in "0123456789")) for line in out), out
    assert any("pair/0 | double cooperative: ready" in line for line in out), out
    assert any("pair/1 | double cooperative: ready" in line for line in out), out
    assert not any("other/" in line for line in out), "another instance's lines leaked in"
    only1 = d.ctl("logs", "pair", "--rank", "1").stdout.splitlines()
    assert only1 and all("pair/1 |" in line for line in only1), only1
    assert len(d.ctl("logs", "pair", "-n", "1").stdout.splitlines()) == 1
    assert d.ctl("logs", "pair", "-n", "0").stdout == ""

    # -f prints what is there, then new lines as the runner writes them (a restart's runner).
    pid0 = d.instance("pair")["ranks"][0]["pid"]
    follower = subprocess.Popen([*EXOCTL, "--socket", str(d.socket), "logs", "pair", "-f",
                                 "--rank", "0", "-n", "1"], stdout=subprocess.PIPE, text=True)
    try:
        assert follower.stdout is not None
        first = follower.stdout.readline()
        assert "pair/0 | double cooperative: ready" in first, first
        d.ctl("restart", "pair")
        new_pid = d.instance("pair")["ranks"][0]["pid"]
        assert new_pid != pid0
        line = follower.stdout.readline()  # the new runner's line, live
        assert "pair/0 | double cooperative: ready" in line, line
        assert follower.poll() is None, "a follower keeps following"
    finally:
        follower.terminate()
        follower.wait(SAFETY)
    # The daemon noticed the follower left and keeps answering.
    assert d.ctl("logs", "pair", "--json", "-n", "1").stdout.startswith("{")


def test_logs_errors(daemons: Callable[..., Daemon], fake_model: Path) -> None:
    d = two_ranks(daemons, fake_model)
    res = d.ctl("logs", "nope", check=False)
    assert res.returncode == 1 and "no instance named 'nope'" in res.stderr, res.stderr
    bad = d.request({"cmd": "logs", "name": "pair", "lines": -3})
    assert bad["ok"] is False and "lines" in bad["error"]
    bad = d.request({"cmd": "logs", "name": "pair", "rank": "x"})
    assert bad["ok"] is False and "rank" in bad["error"]


def complete(socket: Path, words: str) -> list[str]:
    """What bash would offer for the last word of `words` (click's own completion protocol)."""
    parts = words.split(" ")
    env = {**os.environ, "_EXOCTL_COMPLETE": "bash_complete", "COMP_WORDS": words,
           "COMP_CWORD": str(len(parts) - 1), "EXOD_SOCKET": str(socket)}
    res = subprocess.run(EXOCTL, env=env, capture_output=True, text=True, timeout=SAFETY,
                         check=False)
    assert res.returncode == 0 and res.stderr == "", res
    return [line.split(",", 1)[1] for line in res.stdout.splitlines() if line]


def test_completion_of_instance_names(daemons: Callable[..., Daemon], fake_model: Path,
                                      tmp_path: Path) -> None:
    d = two_ranks(daemons, fake_model)
    assert complete(d.socket, "exoctl logs ") == ["other", "pair"]
    assert complete(d.socket, "exoctl start p") == ["pair"]
    assert "logs" in complete(d.socket, "exoctl lo")
    assert "--follow" in complete(d.socket, "exoctl logs pair --f")
    # No daemon: no completions, and nothing printed into the shell.
    assert complete(tmp_path / "absent.sock", "exoctl stop ") == []
