"""`python -m exod.runner`: load one rank of a model, report progress, serve, stop when asked.

Exit codes (see exod.core.exits): 0 after a requested stop, 65 when the model cannot be loaded
(the daemon then marks the instance failed instead of retrying), 69 when mlx is unusable, 64 for
bad arguments, 75 when the rank's address is in use and 76 when a peer of its group was lost
(both retried with backoff).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from exod.core.exits import (
    EXIT_MODEL,
    EXIT_OK,
    EXIT_PEER_LOST,
    EXIT_TEMPFAIL,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
)
from exod.core.shards import Shard
from exod.runner.channel import Channel
from exod.runner.lifecycle import Lifecycle
from exod.runner.log import ERR, WARNING, log
from exod.runner.notify import Notifier

if TYPE_CHECKING:
    from exod.runner.peers import Group
    from exod.runner.load import Loaded


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
    p.add_argument("--backend", choices=("ring", "mpi"), default="ring")
    p.add_argument("--peer-timeout", type=float, default=60.0)
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
    from exod.runner.peers import AddressInUse, PeerLost

    try:
        group = join_group(args, life, notify) if args.world > 1 else None
        total = args.total_layers or _layer_count(args.model)
        shard = make_shard(args, total)
        log(f"loading {args.model} layers [{shard.start}, {shard.end}) of {shard.total}"
            f" ({args.parallelism}, rank {shard.rank}/{shard.world})")
        try:
            loaded = load_shard(
                args.model, shard, parallelism=args.parallelism, dtype=args.dtype,
                progress=notify.progress, should_stop=life.stop.is_set,
                group=group.group if group is not None else None,
            )
        except LoadAborted:
            log(f"stopped during load ({life.reason})")
            notify.stopping()
            return EXIT_OK
        except ModelError as e:
            notify.error(str(e))
            log(f"cannot load {args.model}: {e}", ERR)
            return EXIT_MODEL
        log(f"loaded {loaded.shard.count} layers in {loaded.seconds:.2f}s as {loaded.dtype}; "
            f"{blas_msg}")
        try:
            first_token(loaded, group, notify)
        except ModelError as e:
            notify.error(str(e))
            log(f"cannot generate with {args.model}: {e}", ERR)
            return EXIT_MODEL
        notify.ready()
        if group is None:
            from exod.runner.serve import serve

            serve(loaded, channel, life, notify)
        else:
            serve_group(args, loaded, group, channel, life, notify)
    except AddressInUse as e:
        notify.error(f"address {e} is in use (another instance or program on its port?)")
        log(f"address {e} is in use", ERR)
        return EXIT_TEMPFAIL
    except PeerLost as e:
        notify.error(f"peer lost: {e}")
        log(f"peer lost: {e}; exiting so the group can form again", ERR)
        return EXIT_PEER_LOST
    notify.stopping()
    log(f"stopping: {life.reason}")
    return EXIT_OK


def join_group(args: argparse.Namespace, life: Lifecycle, notify: Notifier) -> Group:
    from exod.runner.peers import connect

    g = connect(args.rank, args.world, args.backend, args.peer_timeout, life, notify)
    log(f"joined the group: rank {g.rank} of {g.size} ({args.backend})")
    return g


def first_token(loaded: Loaded, group: Group | None, notify: Notifier) -> None:
    """READY means it can generate: one real token goes through every rank first (after a
    barrier, so no timeout runs while a peer is still loading). Raises ModelError."""
    from exod.runner.load import ModelError
    from exod.runner.parallel import warm_up

    if group is not None:
        notify.status(f"waiting for the other {group.size - 1} rank(s) to load")
        group.barrier()
        group.arm()
    notify.status("generating a first token")
    try:
        warm_up(loaded, group)
    except Exception as e:  # noqa: BLE001 -- whatever the family raises, the reason is kept
        raise ModelError(f"the first token failed: {type(e).__name__}: {e}") from e


def serve_group(args: argparse.Namespace, loaded: Loaded, group: Group, channel: Channel,
                life: Lifecycle, notify: Notifier) -> None:
    """Wait for every rank to finish loading (a barrier: no timeout), then rank 0 serves and
    the others follow its headers."""
    from exod.runner.peers import PeerLost
    from exod.runner.parallel import LeaderModel, worker_loop

    if group.rank != 0:
        worker_loop(loaded, group, args.parallelism, life)
        return
    from exod.runner.serve import serve

    leader = LeaderModel(loaded, group, args.parallelism)
    serve(dataclasses.replace(loaded, model=leader), channel, life, notify,
          tick=leader.heartbeat, tick_every=group.heartbeat_every)
    try:
        leader.shutdown()
    except PeerLost as e:  # stopping anyway; a peer that left first is no failure
        log(f"group shutdown: {e}")


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
