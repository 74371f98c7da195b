"""`python -m exod.runner --channel-fd N`: load one rank of a model, report progress, serve, stop
when asked.

Its command line holds the channel's descriptor alone. It says hello on the channel; the daemon
answers with the rank's whole start-up spec (`exod.wire.specs.RunnerSpec`: the model, its layers,
the instance's runner options, the group, and the kind of runner: text, vision or embed),
checked field by field on arrival. The kind picks the path (exod.runner.text, .vision, .embed).

Exit codes (see exod.core.exits): 0 after a requested stop, 64 for a bad command line or no
spec, and for a failure the one table of exod.runner.failures: 65 when the model cannot be
loaded (the daemon then marks the instance failed instead of retrying), 69 when mlx is
unusable, 75 when the rank's address is in use and 76 when a peer of its group was lost (both
retried with backoff).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from exod.core.exits import EXIT_OK, EXIT_USAGE
from exod.runner.failures import FAILURES, LoadAborted, exit_for
from exod.runner.link.channel import Channel
from exod.runner.link.lifecycle import Lifecycle
from exod.runner.link.log import ERR, log
from exod.runner.link.report import Reporter
from exod.runner.runner import Runner
from exod.runner.start.prepare import prepare
from exod.wire import messages as m
from exod.wire.specs import RunnerKind, RunnerSpec

# The daemon sends the spec as soon as it reads the hello: a long wait is a daemon that will
# never send it (as long as the daemon waits for a hello: exod.daemon.processes).
SPEC_WAIT = 60.0


def channel_fd(argv: list[str] | None) -> int | None:
    """The one argument. Others are ignored, not refused: a daemon of an older release passes its
    runners flags, and must then hear this runner's hello to say which version it speaks. With
    --zygote-fd this process is the daemon's zygote (exod.runner.start.zygote), and this returns
    only in a runner it forked, with that runner's channel."""
    p = argparse.ArgumentParser(prog="python -m exod.runner", description=__doc__)
    p.add_argument("--channel-fd", type=int, default=None, help="socket to the daemon")
    p.add_argument("--zygote-fd", type=int, default=None,
                   help="be the daemon's zygote on this socket: fork runners when asked")
    args, _ = p.parse_known_args(argv)
    if args.zygote_fd is not None:
        from exod.runner.start import zygote

        return zygote.serve(args.zygote_fd)
    fd: int | None = args.channel_fd
    return fd


def set_environment(spec: RunnerSpec) -> None:
    """What libraries read from the environment, from the spec, before they are imported:
    mx.distributed the rank and the hostfile, OpenBLAS its thread count."""
    if spec.group is None:
        return
    os.environ["MLX_RANK"] = str(spec.shard.rank)
    os.environ["MLX_HOSTFILE"] = str(spec.group.hostfile)
    if spec.group.blas_threads is not None:
        os.environ["OPENBLAS_NUM_THREADS"] = str(spec.group.blas_threads)


def main(argv: list[str] | None = None) -> int:
    try:
        fd = channel_fd(argv)
    except SystemExit as e:
        return EXIT_USAGE if e.code else EXIT_OK
    life = Lifecycle()
    life.install()
    channel = Channel(fd, life)
    channel.start()
    spec = channel.spec(SPEC_WAIT)
    if spec is None:
        return no_spec(life, channel)
    life.watch_parent(spec.parent_pid)
    set_environment(spec)
    r = Runner(spec, life, channel, Reporter(channel))
    r.report.status(m.Phase.STARTING, "importing mlx")
    code, reason = run(r)
    if code == EXIT_OK:
        r.report.stopping(life.reason)
        log(f"stopping: {life.reason}")
    else:
        r.report.failed(reason, code)
        log(reason, ERR)
    return code


def no_spec(life: Lifecycle, channel: Channel) -> int:
    """No spec came: asked to stop first, or the daemon never sent one (or a bad one)."""
    if life.stop.is_set() and not channel.broken:
        log(f"stopping: {life.reason}")
        return EXIT_OK
    if channel.sock is None:
        why = "no channel (--channel-fd): exod starts runners, each with its spec on its channel"
    else:
        why = f"no start-up spec from exod: {channel.broken or f'none within {SPEC_WAIT:g}s'}"
    Reporter(channel).failed(why, EXIT_USAGE)
    log(why, ERR)
    return EXIT_USAGE


def serving(kind: RunnerKind) -> Callable[[Runner, str], None]:
    """The path of the kind of runner the spec names (imported only then: each brings its own
    engine)."""
    if kind == "embed":
        from exod.runner.embed.serve import serve as encoder
        return encoder
    if kind == "vision":
        from exod.runner.vision.serve import serve as seer
        return seer
    from exod.runner.text.serve import serve as text
    return text


def run(r: Runner) -> tuple[int, str]:
    """Load, then serve until asked to stop: (exit code, why it failed)."""
    blas_msg = prepare(r.spec)
    try:
        serving(r.spec.kind)(r, blas_msg)
    except LoadAborted:
        log(f"stopped during load ({r.life.reason})")
    except FAILURES as e:
        return exit_for(e, r.spec.model)
    return EXIT_OK, ""


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown (mlx/threads): memory goes back to the OS with the process.
    os._exit(code)
