"""The zygote's pure parts: which runners may be forked from it (exod.daemon.zygote.fits), and
its wire (exod.wire.zygote) over a real SOCK_SEQPACKET socketpair, descriptors included."""

from __future__ import annotations

import os
import socket

import pytest

from exod.wire import zygote as wire
from exod.daemon.zygote import fits
from exod.wire.protocol import ProtocolError

BASE = {"PATH": "/usr/bin", "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}


def test_only_the_zygotes_own_environment_and_module_are_forked() -> None:
    rank = {**BASE, "EXOD_INSTANCE": "chat", "EXOD_RANK": "1"}
    assert fits(rank, "exod.runner", BASE, "exod.runner")  # per-rank variables aside
    assert not fits({**rank, "HF_HOME": "/x"}, "exod.runner", BASE, "exod.runner")
    assert not fits({k: v for k, v in rank.items() if k != "PATH"}, "exod.runner", BASE,
                    "exod.runner")
    assert not fits({**rank, "PATH": "/bin"}, "exod.runner", BASE, "exod.runner")
    assert not fits(rank, "tests.doubles.runner", BASE, "exod.runner")


def test_a_fork_carries_its_environment_and_three_descriptors() -> None:
    daemon, zygote = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    r, w = os.pipe()
    with daemon, zygote:
        wire.send(daemon, wire.Fork({"A": "é"}), [w, w, r])
        got = wire.recv(zygote, wire.TO_ZYGOTE, wire.FORK_FDS)
        assert got is not None
        msg, fds = got
        assert msg == wire.Fork({"A": "é"}) and len(fds) == 3
        os.write(fds[0], b"x")  # the same pipe, through the copy
        assert os.read(r, 1) == b"x"
        for fd in (*fds, r, w):
            os.close(fd)
        wire.send(zygote, wire.Forked(42))
        assert wire.recv(daemon, wire.FROM_ZYGOTE) == (wire.Forked(42), [])


def test_a_bad_datagram_is_refused_and_its_descriptors_closed() -> None:
    daemon, zygote = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    r, w = os.pipe()
    with daemon, zygote:
        socket.send_fds(daemon, [b'{"type": "fork", "env": 3}'], [w])
        os.close(w)
        with pytest.raises(ProtocolError, match="zygote wire"):
            wire.recv(zygote, wire.TO_ZYGOTE, wire.FORK_FDS)
        assert os.read(r, 1) == b"", "the copy of the write end was closed"
        os.close(r)
        socket.send_fds(daemon, [b'{"type": "forked", "pid": 1}'], [])
        with pytest.raises(ProtocolError, match="unknown message type"):
            wire.recv(zygote, wire.TO_ZYGOTE, wire.FORK_FDS)
        daemon.close()
        assert wire.recv(zygote, wire.TO_ZYGOTE) is None  # the end of the stream
