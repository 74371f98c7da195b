"""A rank's membership in its group: mx.distributed init, the control messages rank 0 sends to
the other ranks, liveness, and what happens when a peer is lost.

Rank 0 drives; the other ranks ("workers") wait for its messages (a serving plan,
exod.runner.group.lockstep; a heartbeat; a shutdown), sent as the typed commands of
`exod.runner.group.wire` over the group's control connections (`exod.runner.group.control`:
plain TCP, since MLX's ring backend burns CPU while a rank idles in recv). Tensors move through
mx.distributed, inside the model's forward.

A peer process that dies closes its sockets: the next send/recv raises PeerLost and the runner
exits with EXIT_PEER_LOST (76, EX_PROTOCOL), so its daemon restarts it with backoff. A network
partition closes nothing: once the group is ready, rank 0 sends a heartbeat when idle (its
serve loop never waits on a request being read), and a watchdog thread ends a rank whose group
has been silent for `peer_timeout`. Never while loading: loading stays timeout-free.
docs/sharding.md, "Several hosts".
"""

from __future__ import annotations

import errno
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import mlx.core as mx

from exod.core.exits import EXIT_PEER_LOST
from exod.runner.failures import AddressInUse, PeerLost
from exod.runner.group import control, wire
from exod.runner.link.lifecycle import Lifecycle
from exod.runner.link.log import ERR, WARNING, log
from exod.wire import messages as m
from exod.runner.link.report import Reporter
from exod.wire.specs import GroupSpec


# Seconds a peer may take per position of a step, on top of peer_timeout: a 2048-token prefill
# chunk on a slow host must not look like a lost peer (CPU decode is well above 2 tokens/s).
PER_TOKEN = 0.5


@dataclass
class Group:
    group: mx.distributed.Group
    rank: int
    size: int
    peer_timeout: float
    report: Reporter
    ctrl: dict[int, socket.socket] = field(default_factory=dict)  # rank → control connection
    _deadline: float | None = None  # the communication in progress must end by then

    # ---- communication ------------------------------------------------------------------
    # `tokens`: how many positions the step carries. A peer may legitimately take long to
    # answer a long prefill, so the time allowed grows with it (see PER_TOKEN).
    def compute(self, x: mx.array | list[mx.array], tokens: int) -> None:
        """Evaluate a forward pass whose layers talk to the group (tensor parallelism's
        all_sum, a pipeline rank's sends): watched like any communication, and a broken peer
        is PeerLost."""
        self._run(lambda: mx.eval(x), tokens)

    def all_sum(self, x: mx.array, tokens: int = 0) -> mx.array:
        out: list[mx.array] = []

        def go() -> None:
            y = mx.distributed.all_sum(x, group=self.group)
            mx.eval(y)
            out.append(y)

        self._run(go, tokens)
        return out[0]

    def _run(self, fn: Callable[[], None], tokens: int = 0) -> None:
        self._deadline = time.monotonic() + self.peer_timeout + tokens * PER_TOKEN
        try:
            fn()
        except (RuntimeError, wire.ControlLost) as e:  # a socket broke, MLX's or ours
            raise PeerLost(str(e)) from None
        finally:
            self._deadline = None

    def send(self, msg: wire.ToWorker) -> None:
        """Rank 0: one command to every other rank (encoded once)."""
        def go() -> None:
            data = wire.frame(msg)
            for dst in range(1, self.size):
                wire.send(self.ctrl[dst], data)

        self._run(go)

    def recv(self) -> wire.ToWorker:
        """A worker: rank 0's next command, checked (anything odd is a lost peer)."""
        got: list[wire.ToWorker] = []
        self._run(lambda: got.append(wire.recv(self.ctrl[0], wire.TO_WORKER)))
        return got[0]

    def barrier(self) -> None:
        """For peers known to be at hand (a heartbeat, a shutdown): an all_sum, whose ring
        backend polls while it waits. For a wait of unknown length, see `wait_until_loaded`."""
        self.all_sum(mx.array([1.0]))

    def wait_until_loaded(self, life: Lifecycle) -> None:
        """Return once every rank has loaded its shard. Over the control connections: a
        blocking read costs no CPU, where an all_sum would poll a core for as long as the
        slowest peer loads (minutes for a big model on a slow disk) and, on one host, slow
        that very load. No timeout, as loading has none: a peer that dies closes its socket
        (PeerLost), and a stop request ends the wait at once (nothing to clean up yet)."""
        try:
            with life.interruptible():
                if self.rank == 0:
                    for r in range(1, self.size):
                        wire.recv(self.ctrl[r], wire.TO_LEADER, limit=64, peer=f"rank {r}")
                    for r in range(1, self.size):
                        wire.send(self.ctrl[r], wire.frame(wire.Go()))
                else:
                    wire.send(self.ctrl[0], wire.frame(wire.ShardLoaded()))
                    self._expect_go()
        except wire.ControlLost as e:
            raise PeerLost(f"while waiting for the group to load: {e}") from None

    def _expect_go(self) -> None:
        got = wire.recv(self.ctrl[0], wire.TO_WORKER)
        if not isinstance(got, wire.Go):
            raise wire.ControlLost(f"rank 0 sent {got.type} before every rank had loaded")

    # ---- liveness ---------------------------------------------------------------------------
    def arm(self) -> None:
        """The group is ready: from now on silence means a lost peer."""
        threading.Thread(target=self._watch, name="exod-group-watchdog", daemon=True).start()

    @property
    def heartbeat_every(self) -> float:
        return max(0.2, self.peer_timeout / 4)

    def _watch(self) -> None:
        while True:
            time.sleep(min(1.0, self.peer_timeout / 4))  # a watchdog's own tick, not a sync
            deadline = self._deadline
            # Rank 0 heartbeats every `heartbeat_every` when idle, so any communication (a
            # worker waiting for its next header included) that outlasts its deadline means
            # silence: a partition, or a peer host gone without closing its sockets.
            if deadline is not None and time.monotonic() > deadline:
                self.lost(f"peer lost: no answer from the group within {self.peer_timeout:g}s"
                          " (plus the allowance for the step's length)")

    def lost(self, why: str) -> None:
        """End this rank at once: its daemon restarts it and it waits for the group again."""
        self.report.failed(why, EXIT_PEER_LOST)
        log(why, ERR)
        os._exit(EXIT_PEER_LOST)


def connect(rank: int, size: int, spec: GroupSpec, life: Lifecycle, report: Reporter) -> Group:
    """Join the group; retried until it forms (a peer host may be down for hours) or we are
    asked to stop. Blocking here is interruptible: a stop request ends the process at once,
    there being nothing to clean up yet. mx.distributed finds the rank and the hostfile in
    MLX_RANK and MLX_HOSTFILE, set from the spec (exod.runner.__main__.set_environment)."""
    backend, peer_timeout = spec.backend, spec.peer_timeout
    attempt = 0
    while True:
        attempt += 1
        report.status(m.Phase.CONNECTING,
                      f"connecting to {size - 1} peer{'s' if size > 2 else ''} "
                      f"(attempt {attempt})", attempt=attempt)
        if backend == "ring" and sys.platform.startswith("linux"):
            check_own_port(rank)
        if rank == 0:
            try:
                control.probe(spec.control)
            except control.ControlAddressInUse as e:
                raise AddressInUse(str(e)) from None
        try:
            with life.holding_the_interpreter():
                g = mx.distributed.init(backend=backend, strict=True)
        except RuntimeError as e:
            text = str(e)
            if _bind_in_use(text):
                raise AddressInUse(address_of(rank) or "the rank's address") from None
            log(f"group not formed yet ({text}); retrying", WARNING)
            continue
        if g.size() != size or g.rank() != rank:
            raise RuntimeError(f"group is rank {g.rank()}/{g.size()}, expected {rank}/{size}")
        group = Group(g, rank, size, peer_timeout, report)
        try:
            with life.interruptible():
                if rank == 0:
                    refusals = control.Refusals(report, attempt, size)
                    group.ctrl = control.accept_workers(spec.control, spec.key_file, size,
                                                        peer_timeout, refusals.refused)
                else:
                    group.ctrl = {0: control.connect_to_leader(spec.control, spec.key_file, rank,
                                                               peer_timeout)}
        except wire.ControlLost as e:
            raise PeerLost(f"control connections: {e}") from None
        except control.ControlAddressInUse as e:
            raise AddressInUse(str(e)) from None
        return group


def check_own_port(rank: int) -> None:
    """AddressInUse when something already holds this rank's ring address. MLX listens with
    SO_REUSEPORT: it would share the port with another group's rank instead of failing, and
    the two groups would then wait in accept() for each other's connections forever. This
    bind has no SO_REUSEPORT, so any listener there makes it fail (SO_REUSEADDR: a closed
    connection of an earlier run in TIME_WAIT does not). Linux only: BSD kernels (macOS) refuse
    such a bind next to any socket of the earlier run still closing, where MLX's own bind
    (SO_REUSEPORT) succeeds; there the daemon's bound on forming covers it."""
    where = address_of(rank)
    if where is None:
        return  # MLX reports a missing or bad hostfile itself
    host, _, port = where.rpartition(":")
    host = host.strip("[]")
    try:
        probe = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    except OSError:
        return
    with probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, int(port)))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise AddressInUse(where) from None
        except (ValueError, OverflowError):
            return  # not a port: MLX says what is wrong with the hostfile


def _bind_in_use(text: str) -> bool:
    """MLX's ring backend reports "Couldn't bind socket (error: N)", N being errno: compared
    with this platform's EADDRINUSE (98 on Linux, 48 on macOS)."""
    m = re.search(r"bind.*\berror: (\d+)", text)
    return m is not None and int(m.group(1)) == errno.EADDRINUSE


def address_of(rank: int) -> str | None:
    """This rank's listening address from the MLX hostfile, for error messages."""
    import json

    try:
        with open(os.environ["MLX_HOSTFILE"]) as f:
            return str(json.load(f)[rank][0])
    except (OSError, KeyError, ValueError, IndexError, TypeError):
        return None

