"""`python -m exod.runner --channel-fd N`: load one rank of a model, report progress, serve, stop
when asked.

Its command line holds the channel's descriptor alone. It says hello on the channel; the daemon
answers with the rank's whole start-up spec (`exod.wire.specs.RunnerSpec`: the model, its layers,
the instance's runner options, the group), checked field by field on arrival.

Exit codes (see exod.core.exits): 0 after a requested stop, 65 when the model cannot be loaded
(the daemon then marks the instance failed instead of retrying), 69 when mlx is unusable, 64 for
a bad command line or no spec, 75 when the rank's address is in use and 76 when a peer of its
group was lost (both retried with backoff).
"""

from __future__ import annotations

import argparse
import os
import sys

from exod.wire import messages as m
from exod.core.exits import (
    EXIT_MODEL,
    EXIT_OK,
    EXIT_PEER_LOST,
    EXIT_TEMPFAIL,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
)
from exod.runner.channel import Channel
from exod.runner.lifecycle import Lifecycle
from exod.runner.log import ERR, INFO, WARNING, log
from exod.runner.report import Reporter
from exod.runner.text import (Runner, first_token, generation_options, join_group, load,
                              options_reason, serve_alone, serve_group)
from exod.wire.specs import RunnerSpec

# The daemon sends the spec as soon as it reads the hello: a long wait is a daemon that will
# never send it (as long as the daemon waits for a hello: exod.daemon.processes).
SPEC_WAIT = 60.0


def channel_fd(argv: list[str] | None) -> int | None:
    """The one argument. Others are ignored, not refused: a daemon of an older release passes
    its runners flags, and must then hear this runner's hello to say which version it speaks.
    With --zygote-fd this process is the daemon's zygote (exod.runner.zygote), and this returns
    only in a runner it forked, with that runner's channel."""
    p = argparse.ArgumentParser(prog="python -m exod.runner", description=__doc__)
    p.add_argument("--channel-fd", type=int, default=None, help="socket to the daemon")
    p.add_argument("--zygote-fd", type=int, default=None,
                   help="be the daemon's zygote on this socket: fork runners when asked")
    args, _ = p.parse_known_args(argv)
    if args.zygote_fd is not None:
        from exod.runner import zygote

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


def prepare(r: Runner) -> str:
    """What must come before mlx runs anything; the line on OpenBLAS for the load's log."""
    from exod.runner import import_table
    from exod.runner.cpu import blas, jit_flags, jit_header

    import_table.install()  # before mlx_lm imports transformers
    flags = jit_flags.install()  # before any kernel, and the header, is compiled
    have_blas, blas_msg = blas.preload()
    if r.spec.group is not None and r.spec.group.blas_threads is not None:
        blas.set_threads(r.spec.group.blas_threads)  # loaded already in a forked runner
    if not have_blas and "not Linux" not in blas_msg:
        log(blas_msg, WARNING)
    built = jit_header.ensure()  # before the model's first kernels are compiled
    if built:
        log(built)
    flags = jit_flags.settle(flags)
    if flags is not None:
        log(flags.line, WARNING if flags.warning else INFO)
    return blas_msg


def run(r: Runner) -> tuple[int, str]:
    """Load, then serve until asked to stop: (exit code, why it failed)."""
    blas_msg = prepare(r)
    from exod.facts.embed import encoding
    from exod.facts.vision import sees

    if encoding(r.spec.model) is not None:  # an embedding model or a reranker
        from exod.runner.embed.serve import serve as serve_encoder

        return serve_encoder(r, blas_msg)
    if sees(r.spec.model) is not None:  # a model that sees: mlx-vlm's path
        from exod.runner.vision.serve import serve

        return serve(r, blas_msg)
    try:
        from exod.runner.load import LoadAborted, ModelError
    except ImportError as e:
        return EXIT_UNAVAILABLE, f"mlx is not usable: {e}"
    from exod.runner.cpu import fused, split
    from exod.runner.group.membership import AddressInUse, PeerLost

    blas_msg += fused.install_note()
    try:
        group = join_group(r) if r.spec.group is not None else None
        loaded = load(r, group)
        log(f"loaded {loaded.shard.count} layers in {loaded.seconds:.2f}s as {loaded.dtype}; "
            f"{blas_msg}")
        log(split.here(loaded.model))
        if group is None:
            options = generation_options(r, loaded)  # the draft loads here, before READY
        elif any(v is not None for v in (options_reason(r.options), r.options.max_kv_size,
                                         r.options.adapters)):
            raise ModelError("kv_bits, max_kv_size, draft_model and adapters are not "
                             "supported with shards > 1")
        first_token(r, loaded, group)
        if group is None:
            serve_alone(r, loaded, *options)
        else:
            serve_group(r, loaded, group)
    except LoadAborted:
        log(f"stopped during load ({r.life.reason})")
    except ModelError as e:
        return EXIT_MODEL, f"cannot load {r.spec.model}: {e}"
    except AddressInUse as e:
        return EXIT_TEMPFAIL, f"address {e} is in use (another instance or program on its port?)"
    except PeerLost as e:
        return EXIT_PEER_LOST, f"peer lost: {e}; exiting so the group can form again"
    return EXIT_OK, ""


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown (mlx/threads): memory goes back to the OS with the process.
    os._exit(code)
