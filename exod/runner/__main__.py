"""`python -m exod.runner`: load one rank of a model, report progress, serve, stop when asked.

Exit codes (see exod.core.exits): 0 after a requested stop, 65 when the model cannot be loaded
(the daemon then marks the instance failed instead of retrying), 69 when mlx is unusable, 64 for
bad arguments, 75 when the rank's address is in use and 76 when a peer of its group was lost
(both retried with backoff).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exod import messages as m
from exod.core.grammar_limits import EngineLimits
from exod.core.exits import (
    EXIT_MODEL,
    EXIT_OK,
    EXIT_PEER_LOST,
    EXIT_TEMPFAIL,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
)
from exod.core.serving import (DEFAULT_KV_GROUP_SIZE, DEFAULT_NUM_DRAFT_TOKENS,
                               DEFAULT_PREFILL_STEP, DEFAULT_PROMPT_CACHE_BYTES,
                               DEFAULT_QUANTIZED_KV_START)
from exod.core.shards import Shard
from exod.runner.channel import Channel
from exod.runner.lifecycle import Lifecycle
from exod.runner.log import ERR, WARNING, log
from exod.runner.report import Reporter

if TYPE_CHECKING:
    from exod.runner.prompt_cache.disk import DiskTier
    from exod.runner.serving.batch_engine import Agree, BatchEngine
    from exod.runner.group.lockstep import LeaderEngine
    from exod.runner.load import Loaded
    from exod.runner.group.membership import Group
    from exod.runner.serving.gen_options import Draft, KvOptions



SETTLE_LIMIT = 60.0  # seconds READY waits at most for the disk tier to open (a hung mount)


@dataclasses.dataclass
class Runner:
    """What every stage of a runner's life needs."""

    args: argparse.Namespace
    life: Lifecycle
    channel: Channel
    report: Reporter


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
    p.add_argument("--heartbeat", type=float, default=m.HEARTBEAT_EVERY)
    p.add_argument("--max-concurrency", type=int, default=1,
                   help="requests generated at once: the batch width")
    p.add_argument("--prompt-cache-bytes", type=int, default=DEFAULT_PROMPT_CACHE_BYTES,
                   help="cap of the prompt cache (0: no prompt cache)")
    p.add_argument("--prompt-cache-dir", type=Path, default=None,
                   help="the instance's folder of the prompt cache's disk tier (none: no disk "
                        "tier)")
    p.add_argument("--prompt-cache-disk-bytes", type=int, default=0,
                   help="cap of the disk tier, on this rank")
    p.add_argument("--warm", type=Path, action="append", default=[],
                   help="a prompt file to prefill into the cache at start (repeatable)")
    p.add_argument("--chat-template-kwargs", type=json.loads, default={},
                   help="the instance's chat_template_kwargs, as JSON (for the warm prompts)")
    p.add_argument("--prefill-step", type=int, default=DEFAULT_PREFILL_STEP,
                   help="prompt tokens prefilled per step at most, over all requests")
    p.add_argument("--grammar-limits", type=EngineLimits.parse, default=EngineLimits(),
                   help="bounds of constrained decoding: SIZE:STATES:FUEL:STEP_FUEL")
    # mlx-lm's generation options (the config's keys of the same names).
    p.add_argument("--kv-bits", type=int, default=None)
    p.add_argument("--kv-group-size", type=int, default=DEFAULT_KV_GROUP_SIZE)
    p.add_argument("--quantized-kv-start", type=int, default=DEFAULT_QUANTIZED_KV_START)
    p.add_argument("--max-kv-size", type=int, default=None)
    p.add_argument("--draft-model", type=Path, default=None)
    p.add_argument("--num-draft-tokens", type=int, default=DEFAULT_NUM_DRAFT_TOKENS)
    p.add_argument("--adapters", type=Path, default=None)
    p.add_argument("--wired-limit", type=int, default=None,
                   help="bytes (macOS); default: the recommended working set")
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
    r = Runner(args, life, channel, Reporter(channel))
    r.report.status(m.Phase.STARTING, "importing mlx")
    code, reason = run(r)
    if code == EXIT_OK:
        r.report.stopping(life.reason)
        log(f"stopping: {life.reason}")
    else:
        r.report.failed(reason, code)
        log(reason, ERR)
    return code


def run(r: Runner) -> tuple[int, str]:
    """Load, then serve until asked to stop: (exit code, why it failed)."""
    from exod.runner import import_table
    from exod.runner.cpu import blas

    import_table.install()  # before mlx_lm imports transformers
    have_blas, blas_msg = blas.preload()
    if not have_blas and "not Linux" not in blas_msg:
        log(blas_msg, WARNING)
    from exod.config.vision import sees

    if sees(r.args.model) is not None:  # a model that sees: mlx-vlm's path
        from exod.runner.vision.serve import serve

        return serve(r, blas_msg)
    try:
        from exod.runner.load import LoadAborted, ModelError
    except ImportError as e:
        return EXIT_UNAVAILABLE, f"mlx is not usable: {e}"
    from exod.runner.cpu import fused
    from exod.runner.group.membership import AddressInUse, PeerLost

    if fused.install():
        blas_msg += "; decode-step rope and norms fused (EXOD_FUSE=0: off)"
    try:
        group = join_group(r) if r.args.world > 1 else None
        loaded = load(r, group)
        log(f"loaded {loaded.shard.count} layers in {loaded.seconds:.2f}s as {loaded.dtype}; "
            f"{blas_msg}")
        if group is None:
            options = generation_options(r, loaded)  # the draft loads here, before READY
        elif any(v is not None for v in (options_reason(r.args), r.args.max_kv_size,
                                         r.args.adapters)):
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
        return EXIT_MODEL, f"cannot load {r.args.model}: {e}"
    except AddressInUse as e:
        return EXIT_TEMPFAIL, f"address {e} is in use (another instance or program on its port?)"
    except PeerLost as e:
        return EXIT_PEER_LOST, f"peer lost: {e}; exiting so the group can form again"
    return EXIT_OK, ""


def load(r: Runner, group: Group | None) -> Loaded:
    from exod.runner.load import load_shard

    args = r.args
    total = args.total_layers or _layer_count(args.model)
    shard = make_shard(args, total)
    log(f"loading {args.model} layers [{shard.start}, {shard.end}) of {shard.total}"
        f" ({args.parallelism}, rank {shard.rank}/{shard.world})")
    return load_shard(
        args.model, shard, parallelism=args.parallelism, dtype=args.dtype,
        progress=r.report.progress, should_stop=r.life.stop.is_set,
        group=group.group if group is not None else None, adapters=args.adapters,
    )


def join_group(r: Runner) -> Group:
    from exod.runner.group.membership import connect

    args = r.args
    g = connect(args.rank, args.world, args.backend, args.peer_timeout, r.life, r.report)
    log(f"joined the group: rank {g.rank} of {g.size} ({args.backend})")
    return g


def first_token(r: Runner, loaded: Loaded, group: Group | None) -> None:
    """READY means it can generate: one real token goes through every rank first (once every
    rank has loaded, so no timeout runs while a peer is still loading). Raises ModelError."""
    from exod.runner.load import ModelError
    from exod.runner.group.group_model import warm_up

    if group is not None:
        from exod.runner.serving import can_batch

        # Only the cache types here: a trial forward would put this rank's sends in the graph
        # (`exod check`'s probe asks the full question before any process starts).
        why = can_batch.unmergeable(loaded.model)
        if why is not None:  # the ranks of a group replay one batch engine in step
            raise ModelError(f"cannot serve this model split across ranks: {why}; "
                             "serve it with 1 rank (one request at a time)")
        r.report.status(m.Phase.WAITING,
                        f"waiting for the other {group.size - 1} rank(s) to load")
        group.wait_until_loaded(r.life)
        group.arm()
    r.report.status(m.Phase.WAITING, "generating a first token")
    try:
        warm_up(loaded, group)
    except Exception as e:  # noqa: BLE001 -- whatever the family raises, the reason is kept
        raise ModelError(f"the first token failed: {type(e).__name__}: {e}") from e


def ready(r: Runner, loaded: Loaded) -> None:
    from exod.runner.serving.model_checks import context_window, model_vocab

    r.report.ready(vocab_size=model_vocab(loaded.model) or 0,
                   context_length=context_window(loaded.model) or 0)


def make_engine(r: Runner, model: Any, tokenizer: Any, kv: KvOptions | None = None,
                disk: DiskTier | None = None, agree: Agree | None = None) -> BatchEngine:
    from exod.runner.serving.batch_engine import BatchEngine

    return BatchEngine(model, tokenizer, width=r.args.max_concurrency,
                       cache_bytes=r.args.prompt_cache_bytes, prefill_step=r.args.prefill_step,
                       grammar_limits=r.args.grammar_limits, kv=kv,
                       on_new_generator=lambda: set_wired_limit(r), disk=disk, agree=agree)


def disk_tier(r: Runner, loaded: Loaded) -> DiskTier | None:
    """The prompt cache's disk tier of this rank, opening (on its own thread): its folder is
    named by everything that makes a stored KV valid (exod.runner.prompt_cache.fingerprint)."""
    import mlx.core as mx
    import mlx_lm

    from exod.runner.cpu import fused
    from exod.runner.prompt_cache import fingerprint as fp
    from exod.runner.prompt_cache.disk import DiskTier

    args = r.args
    if args.prompt_cache_dir is None or args.prompt_cache_disk_bytes <= 0:
        return None
    shard = loaded.shard
    tier = DiskTier(args.prompt_cache_dir, shard.rank, args.prompt_cache_disk_bytes,
                    max_queued=max(256 << 20, args.prompt_cache_bytes))
    tier.open({"format": fp.FORMAT_VERSION, "dtype": loaded.dtype, "layers": shard.arg(),
               "total_layers": shard.total, "world": shard.world,
               "parallelism": args.parallelism, "kv_bits": args.kv_bits,
               "kv_group_size": args.kv_group_size, "quantized_kv_start": args.quantized_kv_start,
               "max_kv_size": args.max_kv_size, "fused": fused.install(),
               "mlx": getattr(mx, "__version__", ""), "mlx_lm": mlx_lm.__version__},
              fp.weight_files(args.model, args.adapters))
    r.life.on_stop(lambda: setattr(tier, "stopping", True))  # a long hash ends at a stop
    tier.on_change = lambda: r.channel.inbox.put(None)  # the loop wakes to report it
    return tier


def warm(r: Runner, engine: BatchEngine | LeaderEngine, tokenizer: Any) -> None:
    """The instance's `warm:` prompts into the prompt cache (prefilled as the loop steps)."""
    from exod.config.warm import read_warm
    from exod.runner.serving.prepare import chat_prompt

    for path in r.args.warm:
        try:
            got = read_warm(path)
            tokens = chat_prompt(tokenizer, got.messages, got.tools,
                                 r.args.chat_template_kwargs, answer=False)
        except Exception as e:  # noqa: BLE001 -- a template may raise anything: a log line
            log(f"warm: cannot use {path}: {type(e).__name__}: {e}", WARNING)
            continue
        if engine.warm(tokens):
            log(f"warm: prefilling {path} ({len(tokens)} tokens)")
        else:
            log(f"warm: {path} ({len(tokens)} tokens) is in the prompt cache already")


def set_wired_limit(r: Runner) -> None:
    from exod.runner import wired
    from exod.runner.load import ModelError

    try:
        wired.apply(r.args.wired_limit)
    except wired.WiredLimitError as e:
        raise ModelError(str(e)) from e


def serve_alone(r: Runner, loaded: Loaded, kv: KvOptions, draft: Draft | None) -> None:
    from exod.runner.serving import can_batch
    from exod.runner.serving.turn_engine import TurnEngine
    from exod.runner.serving.loop import Engine, ServeLoop

    why = can_batch.why_not(loaded.model) or options_reason(r.args)
    engine: Engine
    set_wired_limit(r)
    batch = None
    if why is None:
        disk = disk_tier(r, loaded)
        engine = batch = make_engine(r, loaded.model, loaded.tokenizer, kv, disk)
        wait_settled(disk)
    else:
        log(f"serving one request at a time: {why}")
        engine = TurnEngine(loaded.model, loaded.tokenizer, r.args.max_concurrency,
                            r.args.prefill_step, why=f"one request at a time: {why}",
                            grammar_limits=r.args.grammar_limits, kv=kv, draft=draft)
    ready(r, loaded)
    loop = ServeLoop(engine, r.channel, r.life, r.report, r.args.heartbeat)
    if batch is not None:
        warm(r, batch, loaded.tokenizer)
    loop.run()
    engine.save_cache(loop.flush_deadline())


def options_reason(args: argparse.Namespace) -> str | None:
    """An option mlx-lm runs only without batching (as exod.config.mlx_options.turn_reason)."""
    if args.draft_model is not None:
        return "speculative decoding (draft_model): mlx-lm does not batch it"
    if args.kv_bits is not None:
        return "quantized KV cache (kv_bits): mlx-lm cannot batch it"
    return None


def generation_options(r: Runner, loaded: Loaded) -> tuple[KvOptions, Draft | None]:
    """The KV cache options and the draft model, each checked against the model (a
    ModelError says why one cannot work, before READY)."""
    from exod.runner.load import ModelError, load_draft
    from exod.runner.serving.gen_options import Draft, KvOptions
    from exod.runner.serving.model_checks import model_vocab

    args = r.args
    kv = KvOptions(args.kv_bits, args.kv_group_size, args.quantized_kv_start, args.max_kv_size)
    why = kv.problem(loaded.model)
    if why is not None:
        raise ModelError(why)
    if args.draft_model is None:
        return kv, None
    r.report.status(m.Phase.LOADING, f"loading the draft model {args.draft_model}")
    draft = Draft(load_draft(args.draft_model, loaded.dtype), args.num_draft_tokens)
    why = draft.problem(loaded.model, model_vocab(loaded.model), model_vocab(draft.model))
    if why is not None:
        raise ModelError(why)
    log(f"speculative decoding with {args.draft_model}, {args.num_draft_tokens} draft tokens")
    return kv, draft


def serve_group(r: Runner, loaded: Loaded, group: Group) -> None:
    """Every rank runs the same engine on the same requests: rank 0 serves and sends the
    others its plans, which they replay (exod.runner.group.lockstep). The group has already passed
    its barrier and a first token (`first_token`)."""
    from exod.runner.group.lockstep import LeaderEngine, agreement, follow
    from exod.runner.group.group_model import GroupModel
    from exod.runner.group.membership import PeerLost
    from exod.runner.serving.loop import ServeLoop, Ticker, flush_deadline

    model = GroupModel(loaded, group)
    disk = disk_tier(r, loaded)
    wait_settled(disk)
    ready(r, loaded)
    if group.rank != 0:
        engine = follow(model, loaded.tokenizer, group, r.life, r.args.grammar_limits,
                        make_disk=lambda: disk)
        if engine is not None:
            engine.save_cache(flush_deadline(r.channel))
        return
    leader = LeaderEngine(make_engine(r, model, loaded.tokenizer, disk=disk,
                                      agree=agreement(group)), group)
    loop = ServeLoop(leader, r.channel, r.life, r.report, r.args.heartbeat,
                     tick=Ticker(leader.heartbeat, group.heartbeat_every))
    warm(r, leader, loaded.tokenizer)
    loop.run()
    try:  # first: every rank then writes its own part of the cache at once
        leader.shutdown()
    except PeerLost as e:  # stopping anyway; a peer that left first is no failure
        log(f"group shutdown: {e}")
    leader.save_cache(loop.flush_deadline())


def wait_settled(disk: DiskTier | None) -> None:
    """Before READY: let the disk tier open when that is quick (its weights' hashes are
    recorded), so the first request after a restart finds what was kept; a tier that must hash
    the weights first does it while the instance serves."""
    if disk is not None:
        disk.settled.wait(SETTLE_LIMIT)


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
