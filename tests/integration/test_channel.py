"""The one channel between exod and a runner, with real processes.

- The real runner speaks it: hello with the protocol version first, then typed lifecycle
  reports, its failure with the exit reason, and the exit code to match.
- A signal reaches the runner's channel thread while its main thread sits in a long C call
  (`signal.set_wakeup_fd`): rung 2 of the ladder is seen at once, not after the call.
- A runner that breaks the protocol, or speaks another version, is logged once and ended
  through the ladder (asked first, never a signal), and the restart policy decides what next.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from exod import messages as m
from exod.core.exits import EXIT_MODEL
from exod.protocol import FrameDecoder
from tests.harness import SAFETY, Daemon
from tests.integration.conftest import double_env


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


def test_the_real_runner_says_hello_then_reports_its_failure(tmp_path: Path) -> None:
    ours, theirs = socket.socketpair()
    proc = subprocess.Popen(
        [sys.executable, "-m", "exod.runner", "--model", str(tmp_path / "missing"),
         "--channel-fd", str(theirs.fileno())],
        pass_fds=(theirs.fileno(),), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    theirs.close()
    try:
        got = read_messages(ours, lambda g: any(isinstance(x, m.Failed) for x in g))
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
from exod.runner.channel import Channel
from exod.runner.lifecycle import Lifecycle
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
