"""`python -m exod.runner`: load one rank of a model, report progress, serve, stop when asked.

Exit codes (see exod.core.exits): 0 after a requested stop, 65 when the model cannot be loaded
(the daemon then marks the instance failed instead of retrying), 69 when mlx is unusable, 64 for
bad arguments.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from exod.core.exits import EXIT_MODEL, EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE
from exod.core.shards import Shard
from exod.runner.channel import Channel
from exod.runner.lifecycle import Lifecycle
from exod.runner.log import ERR, WARNING, log
from exod.runner.notify import Notifier


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m exod.runner", description=__doc__)
    p.add_argument("--model", required=True, type=Path)
    p.add_argument("--instance", default="runner")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--layers", default=None, help="START:END of this rank (default: all)")
    p.add_argument("--total-layers", type=int, default=None)
    p.add_argument("--parallelism", choices=("pipeline", "tensor"), default="pipeline")
    p.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"), default="auto")
    p.add_argument("--channel-fd", type=int, default=None, help="socket to the daemon")
    p.add_argument("--parent-pid", type=int, default=None, help="exit when this process dies")
    return p.parse_args(argv)


def make_shard(args: argparse.Namespace, total: int) -> Shard:
    if args.layers is None:
        return Shard(args.rank, args.world, 0, total, total)
    start, _, end = args.layers.partition(":")
    return Shard(args.rank, args.world, int(start), int(end), args.total_layers or total)


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as e:
        return EXIT_USAGE if e.code else EXIT_OK
    life = Lifecycle(args.parent_pid)
    life.install()
    channel = Channel(args.channel_fd, life)
    channel.start()
    notify = Notifier()
    notify.status("starting")

    from exod.runner import blas

    have_blas, blas_msg = blas.preload()
    if not have_blas and "not Linux" not in blas_msg:
        log(blas_msg, WARNING)
    try:
        from exod.runner.load import LoadAborted, ModelError, load_shard
    except ImportError as e:
        notify.error(f"mlx is not usable: {e}")
        log(f"mlx is not usable: {e}", ERR)
        return EXIT_UNAVAILABLE

    total = args.total_layers or _layer_count(args.model)
    shard = make_shard(args, total)
    log(f"loading {args.model} layers [{shard.start}, {shard.end}) of {shard.total}"
        f" ({args.parallelism}, rank {shard.rank}/{shard.world})")
    try:
        loaded = load_shard(
            args.model, shard, parallelism=args.parallelism, dtype=args.dtype,
            progress=notify.progress, should_stop=life.stop.is_set,
        )
    except LoadAborted:
        log(f"stopped during load ({life.reason})")
        notify.stopping()
        return EXIT_OK
    except ModelError as e:
        notify.error(str(e))
        log(f"cannot load {args.model}: {e}", ERR)
        return EXIT_MODEL
    log(f"loaded {shard.count} layers in {loaded.seconds:.2f}s as {loaded.dtype}; {blas_msg}")
    notify.ready()

    from exod.runner.serve import serve

    serve(loaded, channel, life, notify)
    notify.stopping()
    log(f"stopping: {life.reason}")
    return EXIT_OK


def _layer_count(model: Path) -> int:
    from exod.config.load import model_layer_count

    n = model_layer_count(model)
    return n if n is not None else 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown (mlx/threads): memory goes back to the OS with the process.
    os._exit(code)
