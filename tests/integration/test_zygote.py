"""Runners forked from the zygote (exod.daemon.zygote, exod.runner.start.zygote), against real
daemons and real runners of the tiny model: a forked runner is the daemon's own child (its parent,
its exit status, its process group), what cannot be forked is exec'd, and a zygote that dies or is
turned off changes how runners start, nothing else."""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import openai

from tests.harness import Daemon, wait_pid_gone

HELLO = [{"role": "user", "content": "hello"}]


def proc_facts(pid: int) -> tuple[int, int, str]:
    """(parent pid, process group, command line) of a live process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    return int(fields[1]), int(fields[2]), cmdline


def zygote_pid(d: Daemon) -> int:
    found = re.search(r"zygote pid (\d+) ready", d.log_text())
    assert found, "the zygote never said it was ready"
    return int(found.group(1))


def answers(d: Daemon, model: str) -> bool:
    c = openai.OpenAI(base_url=d.api_url() + "/v1", api_key="-", max_retries=0, timeout=120)
    return bool(c.chat.completions.create(model=model, messages=HELLO, max_tokens=3).choices)


def test_forked_runners_are_the_daemons_children_and_others_are_execd(
        daemons: Callable[..., Daemon], tiny_model: Path) -> None:
    d = daemons({"instances": {
        "plain": {"model": str(tiny_model)},
        "pair": {"model": str(tiny_model), "shards": 2},
        "own": {"model": str(tiny_model), "env": {"EXOD_TEST_OWN": "1"}},  # its own env: exec
    }})
    d.start()
    for name in ("plain", "pair", "own"):
        d.until_state(name, "ready")
    assert d.proc is not None
    z = zygote_pid(d)
    for name in ("plain", "pair"):
        for rank in d.instance(name)["ranks"]:
            ppid, pgid, cmdline = proc_facts(rank["pid"])
            assert ppid == d.proc.pid, "a forked runner is re-parented to its daemon"
            assert pgid == rank["pid"], "in a process group of its own, as an exec'd one"
            assert " exod.runner --zygote-fd " in cmdline, cmdline  # exod.child_start
            assert " -P " in cmdline or sys.version_info < (3, 11), cmdline
    own = d.instance("own")["ranks"][0]["pid"]
    assert "--channel-fd" in proc_facts(own)[2], "an instance with an env of its own is exec'd"
    assert b"EXOD_TEST_OWN=1" in Path(f"/proc/{own}/environ").read_bytes()
    assert answers(d, "plain") and answers(d, "pair")
    # Its exit is the daemon's to read: SIGKILL is seen as SIGKILL, and the next one is forked.
    first = d.instance("plain")["ranks"][0]["pid"]
    os.kill(first, signal.SIGKILL)
    inst = d.until_instance("plain", lambda i: i["state"] == "ready" and i["ranks"][0]["pid"]
                            not in (None, first), what="plain back")
    assert inst["ranks"][0]["last_exit"]["signal"] == signal.SIGKILL
    assert "--zygote-fd" in proc_facts(inst["ranks"][0]["pid"])[2]
    assert proc_facts(z)[0] == d.proc.pid  # the zygote itself goes on


def test_a_dead_zygote_leaves_running_runners_alone_and_the_next_is_execd(
        daemons: Callable[..., Daemon], tiny_model: Path) -> None:
    d = daemons({"instances": {"plain": {"model": str(tiny_model)}}})
    d.start()
    before = d.until_state("plain", "ready")["ranks"][0]["pid"]
    z = zygote_pid(d)
    os.kill(z, signal.SIGKILL)
    assert wait_pid_gone(z, 30)
    assert d.instance("plain")["ranks"][0]["pid"] == before and answers(d, "plain")
    d.ctl("restart", "plain")
    inst = d.until_instance("plain", lambda i: i["state"] == "ready" and i["ranks"][0]["pid"]
                            not in (None, before), what="plain restarted")
    assert "--channel-fd" in proc_facts(inst["ranks"][0]["pid"])[2]
    assert "zygote: it exited (" in d.log_text() and "runners are exec'd" in d.log_text()
    assert answers(d, "plain")
    assert not Path(f"/proc/{z}").exists(), "the daemon reaped its dead zygote: no zombie"


def test_exod_zygote_0_execs_every_runner(daemons: Callable[..., Daemon],
                                          tiny_model: Path) -> None:
    d = daemons({"instances": {"plain": {"model": str(tiny_model)}}}, env={"EXOD_ZYGOTE": "0"})
    d.start()
    pid = d.until_state("plain", "ready")["ranks"][0]["pid"]
    assert "--channel-fd" in proc_facts(pid)[2]
    assert "zygote" not in d.log_text()


def test_a_stop_during_the_zygotes_imports_starts_nothing(daemons: Callable[..., Daemon],
                                                         tiny_model: Path) -> None:
    """SIGTERM while the start-up waits for the zygote (here its imports take 60 s, as on a
    cold disk): exod stops at once, and no runner is started behind the stop's back."""
    d = daemons({"instances": {"plain": {"model": str(tiny_model)}}},
                env={"EXOD_DOUBLE_ZYGOTE_DELAY": "60"})
    d.start(wait_ready=False)
    d.listener.wait_for(lambda f: f.get("STATUS") == "importing mlx-lm once, for every runner",
                        gone=d._exited)
    assert d.terminate() == 0
    assert "→ starting" not in d.log_text(), d.log_text()
