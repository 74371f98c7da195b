"""The one channel between exod and a runner, with real processes.

- The real runner speaks it: hello with the protocol version first, then (once it has its spec)
  typed lifecycle reports, its failure with the exit reason, and the exit code to match.
- A signal reaches the runner's channel thread while its main thread sits in a long C call
  (`signal.set_wakeup_fd`): rung 2 of the ladder is seen at once, not after the call.
- A runner that breaks the protocol, or speaks another version, is logged once and ended
  through the ladder (asked first, never a signal), and the restart policy decides what next.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from exod.wire import messages as m
from exod.core.exits import EXIT_MODEL
from exod.core.exits import ExitInfo
from exod.daemon import processes
from exod.daemon.processes import MAX_LINE
from exod.daemon.procinfo import rss_bytes
from exod.config.schema import Instance
from exod.core.shards import Shard
from exod.daemon.launch import Launch, Launcher
from exod.wire.protocol import MAX_FRAME, FrameDecoder, encode
from exod.wire.specs import RunnerSpec
from tests.harness import DOUBLES_ENV, SAFETY, Daemon
from tests.integration.conftest import double_env
from tests.integration.test_security import log_lines, tracebacks


def read_messages(sock: socket.socket, until: Callable[[list[m.FromRunner]], bool]
                  ) -> list[m.FromRunner]:
    sock.settimeout(SAFETY)
    decoder, got = FrameDecoder(), []
    while not until(got):
        data = sock.recv(65536)
        if not data:
            break
        got += [m.decode_from_runner(f) for f in decoder.feed(data)]
    return got


def spec_of(model: Path) -> RunnerSpec:
    """A spec as the daemon would send for a one-rank instance of `model`."""
    return Launcher(model.parent, {}).launch(Instance(name="x", model=model),
                                             Shard(0, 1, 0, 0, 0), 1, 1).spec


def test_the_real_runner_says_hello_then_reports_its_failure(tmp_path: Path) -> None:
    ours, theirs = socket.socketpair()
    proc = subprocess.Popen(
        [sys.executable, "-m", "exod.runner", "--channel-fd", str(theirs.fileno())],
        pass_fds=(theirs.fileno(),), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    theirs.close()
    try:
        got = read_messages(ours, lambda g: len(g) == 1)  # hello, then its spec, as exod does
        ours.sendall(encode(m.to_wire(spec_of(tmp_path / "missing"))))
        got += read_messages(ours, lambda g: any(isinstance(x, m.Failed) for x in g))
        assert proc.wait(SAFETY) == EXIT_MODEL
    finally:
        proc.kill()
        ours.close()
    assert got[0] == m.Hello(version=m.VERSION, pid=proc.pid)
    assert got[1] == m.Status(m.Phase.STARTING, "importing mlx")
    (failed,) = [x for x in got if isinstance(x, m.Failed)]
    assert failed.exit_code == EXIT_MODEL and "missing" in failed.reason


WAKE_PROBE = """
import mlx.core as mx
from exod.runner.link.channel import Channel
from exod.runner.link.lifecycle import Lifecycle
life = Lifecycle(None)
life.install()
life.on_stop(lambda: print(f"stop seen: {life.reason}", flush=True))
Channel(None, life).start()
a = mx.full((1000, 1000), 1e-3)
for _ in range(12):
    a = a @ a
print("computing", flush=True)
mx.eval(a)  # one long C call (seconds): the main thread runs no Python meanwhile
print("computed", flush=True)
"""


def test_a_signal_is_seen_while_the_main_thread_is_in_a_c_call() -> None:
    proc = subprocess.Popen([sys.executable, "-c", WAKE_PROBE], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "computing\n"
        proc.send_signal(signal.SIGTERM)
        # Seen by the channel thread during the computation, not once it is over; and SIGTERM
        # did not kill the process: a runner leaves by itself, through its loop.
        assert proc.stdout.readline() == "stop seen: SIGTERM\n"
        assert proc.stdout.readline() == "computed\n"
        assert proc.wait(SAFETY) == 0
    finally:
        proc.kill()
        proc.wait()


def broken_runner(daemons: Callable[..., Daemon], fake_model: Path, behaviour: str) -> Daemon:
    d = daemons({"instances": {"odd": {
        "model": str(fake_model), "env": double_env(behaviour), "restart": "on-failure",
        "backoff": {"initial": "60s", "jitter": 0}}}})
    d.start()
    return d


def assert_ended_through_the_ladder(d: Daemon, why: str) -> None:
    inst = d.until_state("odd", "backoff")
    errors = [e for e in d.events() if why in e["message"] and e["level"]["name"] == "ERROR"]
    assert len(errors) == 1, errors  # logged once
    assert [e["extra"]["step"] for e in d.events(event="ladder")] == ["ask"]
    assert why in inst["ranks"][0]["error"]
    assert inst["restarts"] == 1
    assert d.terminate() == 0


def test_a_runner_that_breaks_the_protocol_is_ended_through_the_ladder(
        daemons: Callable[..., Daemon], fake_model: Path) -> None:
    d = broken_runner(daemons, fake_model, "garbage")
    assert_ended_through_the_ladder(d, "protocol error from the runner: progress.loaded")


def test_a_runner_of_another_protocol_version_is_refused(
        daemons: Callable[..., Daemon], fake_model: Path) -> None:
    d = broken_runner(daemons, fake_model, "old-protocol")
    assert_ended_through_the_ladder(d, f"speaks version {m.VERSION + 1}")


# ---- hostile runners: each is ended through the ladder, and the daemon shrugs it off -----------
def assert_no_tracebacks(d: Daemon) -> None:
    assert tracebacks(d) == []


def test_a_frame_nested_too_deeply_is_a_protocol_error(
        daemons: Callable[..., Daemon], fake_model: Path) -> None:
    # json.loads raises RecursionError, not ValueError: it used to kill the channel's reader
    # task (a traceback in the log) and leave the runner running, unsupervised.
    d = broken_runner(daemons, fake_model, "nested")
    assert_no_tracebacks(d)
    assert_ended_through_the_ladder(d, "protocol error from the runner: bad JSON frame: nested")


def test_impossible_progress_is_a_protocol_error(
        daemons: Callable[..., Daemon], fake_model: Path) -> None:
    d = broken_runner(daemons, fake_model, "bad-progress")
    assert_ended_through_the_ladder(d, "protocol error from the runner: progress: 5 of 4")


def test_a_huge_frame_is_refused_before_it_is_read(
        daemons: Callable[..., Daemon], fake_model: Path) -> None:
    d = broken_runner(daemons, fake_model, "huge-frame")
    assert_ended_through_the_ladder(d, f"frame of {MAX_FRAME} bytes exceeds the")


def test_a_runner_that_closes_its_channel_but_keeps_running_is_ended(
        daemons: Callable[..., Daemon], fake_model: Path) -> None:
    d = broken_runner(daemons, fake_model, "mute")
    inst = d.until_state("odd", "backoff")
    why = "closed its channel but kept running"
    assert why in inst["ranks"][0]["error"]
    # Rung 1 cannot reach it (its channel is gone), so rung 2 does, after rung 1's grace.
    assert [e["extra"]["step"] for e in d.events(event="ladder")] == ["ask", "SIGTERM"]
    assert inst["restarts"] == 1
    assert_no_tracebacks(d)
    assert d.terminate() == 0


def test_a_flooding_runner_leaves_the_daemon_bounded_and_responsive(
        daemons: Callable[..., Daemon], fake_model: Path) -> None:
    d = broken_runner(daemons, fake_model, "flood")
    assert d.proc is not None
    # Printed after the flood was sent (and all but a socket buffer of it read).
    deadline = time.monotonic() + SAFETY
    while log_lines(d, "double flood: sent") == 0:
        assert time.monotonic() < deadline, "the flood was never sent"
        time.sleep(0.1)  # polling the log for a condition, not waiting for luck
    inst = d.instance("odd")  # the control socket answers
    assert inst["state"] == "ready" and inst["restarts"] == 0
    rss = rss_bytes(d.proc.pid)
    assert rss is not None and rss < 200 * 2**20, rss  # ~70 MB idle; 64 MiB frames would double
    # 8 MiB of stderr without a newline: logged in pieces of at most MAX_LINE.
    pieces = [e for e in d.events() if set(e["message"]) <= set("| y") and "yyy" in e["message"]]
    assert len(pieces) >= 8 and all(len(e["message"]) <= MAX_LINE + 2 for e in pieces)
    assert_no_tracebacks(d)
    assert d.terminate() == 0
    assert [e["extra"]["step"] for e in d.events(event="ladder")] == ["ask"]


def test_a_runner_that_never_says_hello_is_reported_broken(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # The daemon's process table with a real child; the deadline shortened for the test (60 s
    # in the daemon: the hello precedes every heavy import).
    monkeypatch.setattr(processes, "HELLO_DEADLINE", 0.5)

    async def scenario() -> tuple[list[str], ExitInfo]:
        loop = asyncio.get_running_loop()
        table = processes.ProcessTable(loop)
        table.install()
        broken: list[str] = []
        exited: asyncio.Future[ExitInfo] = loop.create_future()
        handlers = processes.RunnerHandlers(
            on_exit=lambda pid, info: exited.set_result(info),
            on_message=lambda pid, msg: None,
            on_broken=lambda pid, why: (broken.append(why), table.kill(pid, signal.SIGTERM)))
        spec = spec_of(tmp_path / "m")
        env = {**os.environ, **DOUBLES_ENV, "EXOD_DOUBLE": "silent"}  # tests/ on its path
        table.spawn(Launch("tests.doubles.runner", spec, env, m.decode_from_runner, tmp_path),
                    {"instance": "t"}, handlers)
        info = await asyncio.wait_for(exited, SAFETY)
        loop.remove_signal_handler(signal.SIGCHLD)
        return broken, info

    broken, info = asyncio.run(scenario())
    assert broken == ["the runner said no hello within 0.5s"]
    assert info.signal == signal.SIGTERM
