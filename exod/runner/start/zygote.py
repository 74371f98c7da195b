"""`python -m exod.runner --zygote-fd N`: a runner's imports done once, then forked per rank.

Every runner imports mlx-lm (with it transformers, huggingface_hub and numpy) and exod's runner
modules before it can load a layer: nearly all of what a small model's rank costs before READY
(docs/operating.md, "The zygote"; `python -m bench runner_start`). The zygote imports them once
per daemon, says it is ready, and for each rank the daemon asks for forks twice: the grandchild
is set up as an exec'd runner would be and goes on into the runner's `main`; the middle process
exits at once, so the runner is re-parented to the daemon, its subreaper (exod.daemon.zygote).

Fork is safe because nothing in the zygote holds state a fork cannot copy: it never runs a
model, allocates mlx memory or touches a device, and its only threads, OpenBLAS's, stop around a
fork (pthread_atfork). Where that cannot be promised (not Linux: Metal must not be forked; a GPU
build of mlx) it declines and every runner is exec'd. A library reads the zygote's environment
at import, so only runners whose environment is the zygote's (but for EXOD_INSTANCE and
EXOD_RANK, set in os.environ) are forked; an instance with an `env:` of its own is exec'd.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.metadata
import os
import secrets
import signal
import socket
import sys

from exod.wire import zygote as wire
from exod.wire.protocol import ProtocolError

PR_SET_PDEATHSIG = 1
# What a text runner imports before it loads (exod.runner.__main__.run and exod.runner.text).
WARM = ("mlx.core", "mlx_lm", "exod.runner.text.serve", "exod.runner.text.load",
        "exod.runner.cpu.fused", "exod.runner.group.membership",
        "exod.runner.serving.batch_engine", "exod.runner.serving.loop",
        "exod.runner.serving.turn_engine", "exod.runner.serving.prepare",
        "exod.runner.serving.model_checks", "exod.runner.prompt_cache.disk",
        "exod.runner.prompt_cache.fingerprint", "exod.config.warm", "exod.config.mlx_options",
        "exod.facts.model_dir")
# mlx builds whose device runtime must never be forked (the distributions' name prefixes).
GPU_BUILDS = ("mlx-cuda", "mlx-metal")
# What a forked runner runs of these is what the zygote imported: once any of them is upgraded
# on disk, runners are exec'd (the new code, and its protocol version checked at hello).
PACKAGES = ("exod", "mlx.core", "mlx_lm", "transformers")
# Dispositions an exec'd Python starts with: SIGINT raises KeyboardInterrupt, SIGPIPE is
# ignored (Python's own start-up), the rest are the defaults.
DEFAULT_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGUSR1,
                   signal.SIGUSR2, signal.SIGQUIT)


def serve(fd: int) -> int:
    """The zygote's life. Returns only in a forked runner: its channel's descriptor."""
    sock = socket.socket(fileno=fd)
    _die_with_parent()
    why = warm()
    versions = installed()
    _say(sock, wire.ZygoteDeclined(why) if why is not None else wire.ZygoteReady(os.getpid()))
    if why is not None:
        os._exit(0)
    while True:
        try:
            got = wire.recv(sock, wire.TO_ZYGOTE, wire.FORK_FDS)
        except (OSError, ProtocolError):
            os._exit(0)
        if got is None:  # the daemon is gone, or done with us
            os._exit(0)
        msg, fds = got
        if len(fds) != wire.FORK_FDS:
            wire.close_fds(fds)
            _say(sock, wire.ForkFailed(f"{len(fds)} descriptors, not {wire.FORK_FDS}"))
            continue
        if installed() != versions:
            wire.close_fds(fds)
            _say(sock, wire.ForkFailed("packages were upgraded since the zygote started"))
            os._exit(0)  # the daemon finds it gone at the next fork, and execs from then on
        channel = fork_runner(sock, msg.env, fds)
        if channel is not None:
            return channel


def installed() -> list[tuple[int, int] | None]:
    """The packages' files on disk, as (inode, mtime) of each one's `__init__.py`: an upgrade
    writes new files. Four stat calls, cheap enough for every fork."""
    out: list[tuple[int, int] | None] = []
    for name in PACKAGES:
        path = getattr(sys.modules.get(name), "__file__", None)
        try:
            st = os.stat(path) if path else None
        except OSError:
            st = None
        out.append((st.st_ino, st.st_mtime_ns) if st is not None else None)
    return out


def _say(sock: socket.socket, msg: object) -> None:
    """To the daemon; if it is gone (or gave up on this zygote), there is no one to serve."""
    try:
        wire.send(sock, msg)
    except OSError:
        os._exit(0)


def warm() -> str | None:
    """Import what a runner imports; why not to fork runners here, if so."""
    if not sys.platform.startswith("linux"):
        return f"forking runners is done on Linux only (this is {sys.platform})"
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name.startswith(GPU_BUILDS):  # mlx-cuda-12, mlx-cuda-13, mlx-metal...
            return f"{name} is installed: a GPU runtime must not be forked"
    from exod.runner.start import import_table
    from exod.runner.cpu import blas

    import_table.install()  # before mlx_lm imports transformers
    blas.preload()  # before mlx: its BLAS symbols resolve to OpenBLAS
    try:
        for name in WARM:
            importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 -- a broken install: the exec'd runner says what
        return f"importing the runner failed: {type(e).__name__}: {e}"
    return None


def fork_runner(sock: socket.socket, env: dict[str, str], fds: list[int]) -> int | None:
    """Fork a runner; answer the daemon with its pid. In the runner: its channel's descriptor;
    in the zygote: None."""
    report_r, report_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        middle = os.fork()
    except OSError as e:
        wire.close_fds([report_r, report_w, *fds])
        _say(sock, wire.ForkFailed(f"fork: {e.strerror}"))
        return None
    if middle == 0:
        os.close(report_r)
        try:
            pid = os.fork()
        except OSError:
            os._exit(1)
        if pid == 0:
            os.close(report_w)
            return become_runner(sock, env, fds)
        os.write(report_w, str(pid).encode())
        os._exit(0)
    os.close(report_w)
    os.waitpid(middle, 0)  # gone: the runner's parent is now the daemon
    # The middle wrote the pid before it exited: one read, never a wait on the runner itself
    # (which holds a copy of the pipe until it has closed it).
    said = os.read(report_r, 64).decode(errors="replace")
    os.close(report_r)
    wire.close_fds(fds)
    if not said.isdigit():
        _say(sock, wire.ForkFailed("the second fork failed"))
        return None
    _say(sock, wire.Forked(int(said)))
    return None


def become_runner(sock: socket.socket, env: dict[str, str], fds: list[int]) -> int:
    """In the grandchild: what posix_spawn and exec would have given a runner."""
    sock.close()  # the zygote's line to the daemon is not the runner's
    channel, out, err = fds
    os.setpgid(0, 0)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(err, 2)
    wire.close_fds([null, out, err])
    signal.pthread_sigmask(signal.SIG_SETMASK, ())
    for sig in DEFAULT_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    os.environ.clear()
    os.environ.update(env)
    # Global generators seeded at import would be the same in every runner (Python's `random`
    # reseeds itself after a fork). exod's samplers take their keys from `secrets`; these are
    # for any code that does not.
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()
    mx = sys.modules.get("mlx.core")
    if mx is not None:
        mx.random.seed(secrets.randbits(63))
    return channel


def _die_with_parent() -> None:
    """The zygote never outlives the daemon (SIGKILL, the OOM killer): SIGTERM's default
    action ends it, and it has nothing to save."""
    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it died before prctl: no signal will come
        os._exit(0)

