"""A runner double for supervision tests: speaks exod's real runner protocol (typed messages on
its channel, exit codes) but loads nothing, and misbehaves on purpose. The daemon execs it in
place of exod.runner when its own environment says `EXOD_RUNNER_MODULE=tests.doubles.runner`
(see tests/harness.py); an instance then picks a behaviour with `env: {EXOD_DOUBLE: <name>}`.
Without EXOD_DOUBLE it execs the real runner, so one daemon can mix real runners and doubles.
Like the real runner it says hello and then reads its start-up spec (exod.wire.specs.RunnerSpec) on
its channel: its layer count comes from there (4 when the daemon could not count them).

Behaviours:
  stubborn      load, READY, then ignore the shutdown request, SIGTERM and SIGINT (it reads
                its spec, then never reads its channel again)
  hang-loading  report layer 1/N, then hang (still honours the shutdown request)
  crash         exit 1 at once
  crash-ready   load, READY, then exit 1 when it receives anything on the channel
  cooperative   load, READY, exit 0 when asked (a fast stand-in for benchmarks of the daemon)
  gated         a load the test controls: wait EXOD_DOUBLE_FIRST_SECONDS (default 0, as an import
                or a wait for peers would), report layers 1..N-1, EXOD_DOUBLE_LAYER_SECONDS apart
                (default 0); then, if EXOD_DOUBLE_GATE names a file, wait until it exists (polled);
                then layer N/N and READY, and behave as cooperative. Honours the shutdown request
                at every point, so a gated load can also be stopped mid-way.
  garbage       load, READY, then send a message that breaks the protocol (a field of the wrong
                type), then behave as cooperative
  old-protocol  say hello with another protocol version, then behave as cooperative
  nested        load, READY, then send a frame of JSON nested 100,000 deep
  bad-progress  load, READY, then report 5 of 4 layers loaded
  huge-frame    load, READY, then announce a frame of MAX_FRAME bytes and start sending it
  storm         load, READY, then send valid lifecycle frames as fast as it can until asked
                to stop (a benchmark's flooding runner)
  silent        never say hello (nor anything else); the default SIGTERM ends it
  mute          load, READY, then close its channel and keep running (until SIGTERM)
  flood         load, READY, then send 100,000 valid lifecycle frames, Done and Error for
                request ids it was never given, Ready again, and 8 MiB of stderr without a
                newline; then behave as cooperative
  chatty        load, READY, then answer every request with text as fast as the channel takes
                it, until the request is cancelled (says so on stderr) or the runner stops
  squatted      the real runner, in this process, but the rank named by EXOD_DOUBLE_SQUAT_RANK
                first listens on its own ring port the way another group's rank does
                (SO_REUSEADDR and SO_REUSEPORT), as if the port were taken between the daemon's
                choice and the rank's bind. Only while EXOD_DOUBLE_MARK names no file (it
                creates it), so the group's restart runs clean.
  group         the real runner, in this process, but the rank named by EXOD_DOUBLE_GROUP_RANK
                (as EXOD_RANK, set by the daemon for people and tools, says) speaks the group
                protocol version EXOD_DOUBLE_GROUP_VERSION (when set: a rank of another exod
                release), and waits EXOD_DOUBLE_CONTROL_DELAY seconds (when set) before it
                connects to rank 0's control port (so a test can knock on that port while the
                group forms).
"""

# ruff: noqa: E402 -- the real runner starts before the imports only the doubles need

from __future__ import annotations

import os
import sys

# On the real runner's path: a trio that cannot be imported (see no_trio/trio/__init__.py).
NO_TRIO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "no_trio")


def become_the_real_runner() -> None:
    """exec exod.runner: same pid, same channel fd (its spec is still to come on it), same
    command line, started as the daemon starts it (safe-path mode, here: exod.child_start)."""
    from exod.child_start import python_argv  # light: ~5 ms

    path = os.pathsep.join(p for p in (NO_TRIO, os.environ.get("PYTHONPATH")) if p)
    os.execve(sys.executable, python_argv("exod.runner", sys.argv[1:], os.getcwd()),
              {**os.environ, "PYTHONPATH": path})


if __name__ == "__main__" and "EXOD_DOUBLE" not in os.environ:
    if "--zygote-fd" in sys.argv and os.environ.get("EXOD_DOUBLE_ZYGOTE_DELAY"):
        import time  # a zygote whose imports take this long (a cold disk): the daemon's wait

        time.sleep(float(os.environ["EXOD_DOUBLE_ZYGOTE_DELAY"]))
    become_the_real_runner()  # before the imports below: ~0.05 CPU-s a runner

import argparse
import queue
import signal
import socket
import threading
from collections.abc import Callable
from pathlib import Path

from exod.wire import messages as m
from exod.wire.protocol import HEADER, MAX_FRAME, FrameDecoder, encode, from_wire
from exod.runner.link.channel import Channel
from exod.runner.link.lifecycle import Lifecycle
from exod.runner.link.report import Reporter
from exod.wire.specs import RUNNER_FIRST, RunnerSpec


def gated_load(notify: Reporter, life: Lifecycle, n: int) -> bool:
    """Layers 1..n-1, paced; the gate; layer n. False if a stop was requested meanwhile."""
    pause = float(os.environ.get("EXOD_DOUBLE_LAYER_SECONDS") or 0)
    gate = os.environ.get("EXOD_DOUBLE_GATE")
    if life.stop.wait(float(os.environ.get("EXOD_DOUBLE_FIRST_SECONDS") or 0)):
        return False
    for i in range(1, n):
        notify.progress(i, n)
        if life.stop.wait(pause):
            return False
    while gate and not os.path.exists(gate):
        if life.stop.wait(0.02):
            return False
    notify.progress(n, n)
    return True


def flood(sock: socket.socket, n: int) -> None:
    beat = encode({"type": "heartbeat"})
    status = encode({"type": "status", "phase": "ready", "text": "x" * 200})
    sock.sendall((beat + status) * 50_000)
    sock.sendall(encode({"type": "done", "id": "r999", "finish_reason": "stop",
                         "prompt_tokens": 1, "completion_tokens": 1}))
    sock.sendall(encode({"type": "error", "id": "nobody", "code": "internal", "message": "?"}))
    sock.sendall(encode({"type": "ready", "vocab_size": 5, "context_length": 5}))
    chunk = "y" * (1 << 20)
    for _ in range(8):
        sys.stderr.write(chunk)
    sys.stderr.write("\n")
    print("double flood: sent", file=sys.stderr, flush=True)


def mute(sock: socket.socket, n: int) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    sock.shutdown(socket.SHUT_RDWR)
    threading.Event().wait()  # until SIGTERM ends it


MISBEHAVIOURS: dict[str, Callable[[socket.socket, int], None]] = {
    "garbage": lambda sock, n: sock.sendall(
        encode({"type": "progress", "loaded": "many", "total": n})),
    "nested": lambda sock, n: sock.sendall(framed(
        b'{"type":"status","phase":"ready","text":' + b"[" * 100_000 + b"]" * 100_000 + b"}")),
    "bad-progress": lambda sock, n: sock.sendall(
        encode({"type": "progress", "loaded": n + 1, "total": n})),
    "huge-frame": lambda sock, n: sock.sendall(HEADER.pack(MAX_FRAME) + b"{" * 65536),
    "mute": mute,
    "flood": flood,
}


def chatty(channel: Channel, life: Lifecycle) -> None:
    live: set[str] = set()
    while not life.stop.is_set():
        try:
            req = channel.inbox.get(block=not live, timeout=0.1)
            if req is not None:
                live.add(req.id)
        except queue.Empty:
            pass
        for rid in list(live):
            if rid in channel.cancelled:
                live.discard(rid)
                print(f"double chatty: {rid} cancelled", file=sys.stderr, flush=True)
            else:
                channel.send_all([m.Text(rid, "word ")] * 64)


def framed(body: bytes) -> bytes:
    return HEADER.pack(len(body)) + body


def first_frame(sock: socket.socket) -> RunnerSpec | None:
    """The spec, read here once: the stubborn double never reads its channel again."""
    decoder = FrameDecoder()
    while True:
        data = sock.recv(65536)
        if not data:
            return None
        frames = decoder.feed(data)
        if frames:
            spec: RunnerSpec = from_wire(frames[0], RUNNER_FIRST)
            return spec


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--channel-fd", type=int)
    args, _ = p.parse_known_args()
    behaviour = os.environ.get("EXOD_DOUBLE", "cooperative")
    life = Lifecycle()
    life.install()
    if behaviour == "silent":
        life.watch_parent(os.getppid())  # it never hears its spec, which names the daemon
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        threading.Event().wait()
    channel = Channel(args.channel_fd, life)
    notify = Reporter(channel)
    if behaviour == "crash":
        print("<3>double: crashing as told", file=sys.stderr, flush=True)
        return 1
    if behaviour == "stubborn":
        # Never read the channel after the spec (the shutdown request sits unread) and ignore
        # SIGTERM.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        channel.send(m.Hello(version=m.VERSION, pid=os.getpid()))
        assert channel.sock is not None
        spec = first_frame(channel.sock)
    else:
        if behaviour == "old-protocol":
            m.VERSION += 1  # what a runner of another exod release would say
        channel.start()
        spec = channel.spec(60)  # none for old-protocol: the daemon refuses its hello
    if spec is not None:
        life.watch_parent(spec.parent_pid)
    n = spec.shard.total if spec is not None and spec.shard.total else 4
    if behaviour == "hang-loading":
        notify.progress(1, n)
        life.stop.wait()
        return 0
    if behaviour == "gated":
        if not gated_load(notify, life, n):
            return 0  # asked to stop mid-load
    else:
        for i in range(n + 1):
            notify.progress(i, n)
    notify.ready()
    print(f"double {behaviour}: ready", file=sys.stderr, flush=True)
    if behaviour in MISBEHAVIOURS:
        assert channel.sock is not None
        MISBEHAVIOURS[behaviour](channel.sock, n)
    if behaviour == "stubborn":
        threading.Event().wait()
    if behaviour == "chatty":
        chatty(channel, life)
    if behaviour == "storm":
        burst = (encode({"type": "heartbeat"})
                 + encode({"type": "status", "phase": "ready", "text": "x" * 200})) * 500
        while not life.stop.is_set() and channel.sock is not None:
            channel.sock.sendall(burst)
    life.stop.wait()
    if behaviour == "crash-ready":
        return 1
    notify.stopping()
    return 0


SQUATS: list[socket.socket] = []  # kept open while the runner lives


def squat_own_port() -> None:
    """The squatted behaviour: a listener on this rank's ring address, as the rank is about to
    join its group (MLX_RANK and MLX_HOSTFILE: set by the runner from its spec)."""
    import json

    mark = os.environ["EXOD_DOUBLE_MARK"]
    rank = int(os.environ["MLX_RANK"])
    if rank != int(os.environ["EXOD_DOUBLE_SQUAT_RANK"]) or os.path.exists(mark):
        return
    open(mark, "x").close()
    with open(os.environ["MLX_HOSTFILE"]) as f:
        host, _, port = json.load(f)[rank][0].rpartition(":")
    squat = socket.socket()
    squat.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squat.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    squat.bind((host, int(port)))
    squat.listen()
    SQUATS.append(squat)
    print(f"double squatted: listening on {host}:{port}", file=sys.stderr, flush=True)


def run_the_real_runner() -> None:
    """exod.runner, in this process (with the test's patches), on the real runner's path."""
    import runpy

    sys.path.insert(0, NO_TRIO)
    runpy.run_module("exod.runner", run_name="__main__", alter_sys=True)


def squatted() -> None:
    """Patch this rank's joining of its group to squat first, then run the real runner here."""
    from exod.runner.group import membership

    connect = membership.connect

    def squatting(*args: object, **kwargs: object) -> membership.Group:
        squat_own_port()
        return connect(*args, **kwargs)  # type: ignore[arg-type]

    membership.connect = squatting  # type: ignore[assignment]
    run_the_real_runner()


def other_group() -> None:
    """The group behaviour: patch this rank's group wire, then run the real runner here."""
    import time

    from exod.runner.group import control, handshake, wire

    if os.environ.get("EXOD_RANK") == os.environ.get("EXOD_DOUBLE_GROUP_RANK"):
        version = os.environ.get("EXOD_DOUBLE_GROUP_VERSION")
        if version:
            wire.OURS = handshake.OURS = f"EXOD-GROUP-{int(version)}"
            wire.PREAMBLE = handshake.PREAMBLE = f"EXOD-GROUP-{int(version)}\n".encode()
        delay = float(os.environ.get("EXOD_DOUBLE_CONTROL_DELAY") or 0)
        connect = control.connect_to_leader

        def late(address: str, key_file: Path, rank: int, timeout: float) -> socket.socket:
            print(f"double group: connecting to rank 0 in {delay:g}s", file=sys.stderr,
                  flush=True)
            time.sleep(delay)  # the window a test knocks in
            return connect(address, key_file, rank, timeout)

        control.connect_to_leader = late
    run_the_real_runner()


if __name__ == "__main__":
    if os.environ.get("EXOD_DOUBLE") == "group":
        other_group()
    elif os.environ.get("EXOD_DOUBLE") == "squatted":
        squatted()
    else:
        code = main()
        sys.stderr.flush()
        os._exit(code)
