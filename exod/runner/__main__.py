"""`python -m exod.runner --channel-fd N`: load one rank of a model, report progress, serve, stop
when asked.

Its command line holds the channel's descriptor alone. It says hello on the channel; the daemon
answers with the rank's whole start-up spec (`exod.specs.RunnerSpec`: the model, its layers, the
instance's runner options, the group), checked field by field on arrival.

Exit codes (see exod.core.exits): 0 after a requested stop, 65 when the model cannot be loaded
(the daemon then marks the instance failed instead of retrying), 69 when mlx is unusable, 64 for
a bad command line or no spec, 75 when the rank's address is in use and 76 when a peer of its
group was lost (both retried with backoff).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exod import messages as m
from exod.config.schema import RunnerOptions
from exod.core.exits import (
    EXIT_MODEL,
    EXIT_OK,
    EXIT_PEER_LOST,
    EXIT_TEMPFAIL,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
)
from exod.core.serving import DEFAULT_PREFILL_STEP
from exod.core.shards import Shard
from exod.runner.channel import Channel
from exod.runner.lifecycle import Lifecycle
from exod.runner.log import ERR, WARNING, log
from exod.runner.report import Reporter
from exod.specs import RunnerSpec

if TYPE_CHECKING:
    from exod.runner.group.lockstep import LeaderEngine
    from exod.runner.prompt_cache.disk import DiskTier
    from exod.runner.serving.batch_engine import Agree, BatchEngine
    from exod.runner.load import Loaded
    from exod.runner.group.membership import Group
    from exod.runner.serving.gen_options import Draft, KvOptions

# The daemon sends the spec as soon as it reads the hello: a long wait is a daemon that will
# never send it (as long as the daemon waits for a hello: exod.daemon.processes).
SPEC_WAIT = 60.0
SETTLE_LIMIT = 60.0  # seconds READY waits at most for the disk tier to open (a hung mount)


@dataclasses.dataclass
class Runner:
    """What every stage of a runner's life needs."""

    spec: RunnerSpec
    life: Lifecycle
    channel: Channel
    report: Reporter

    @property
    def options(self) -> RunnerOptions:
        return self.spec.options


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


def make_shard(spec: RunnerSpec, total: int) -> Shard:
    """The spec's layers; all `total` of them when the daemon could not count them."""
    s = spec.shard
    return s if s.total else Shard(s.rank, s.world, 0, total, total)


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
    from exod.runner.cpu import blas, jit_header

    import_table.install()  # before mlx_lm imports transformers
    have_blas, blas_msg = blas.preload()
    if r.spec.group is not None and r.spec.group.blas_threads is not None:
        blas.set_threads(r.spec.group.blas_threads)  # loaded already in a forked runner
    if not have_blas and "not Linux" not in blas_msg:
        log(blas_msg, WARNING)
    built = jit_header.ensure()  # before the model's first kernels are compiled
    if built:
        log(built)
    return blas_msg


def run(r: Runner) -> tuple[int, str]:
    """Load, then serve until asked to stop: (exit code, why it failed)."""
    blas_msg = prepare(r)
    from exod.config.embed import encoding
    from exod.config.vision import sees

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
    from exod.runner.cpu import fused
    from exod.runner.group.membership import AddressInUse, PeerLost

    if fused.install():
        blas_msg += "; decode-step rope and norms fused (EXOD_FUSE=0: off)"
    try:
        group = join_group(r) if r.spec.group is not None else None
        loaded = load(r, group)
        log(f"loaded {loaded.shard.count} layers in {loaded.seconds:.2f}s as {loaded.dtype}; "
            f"{blas_msg}")
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


def load(r: Runner, group: Group | None) -> Loaded:
    from exod.runner.load import load_shard

    spec = r.spec
    shard = make_shard(spec, spec.shard.total or _layer_count(spec.model))
    log(f"loading {spec.model} layers [{shard.start}, {shard.end}) of {shard.total}"
        f" ({spec.parallelism}, rank {shard.rank}/{shard.world})")
    return load_shard(
        spec.model, shard, parallelism=spec.parallelism, dtype=r.options.dtype,
        progress=r.report.progress, should_stop=r.life.stop.is_set,
        group=group.group if group is not None else None, adapters=r.options.adapters,
    )


def join_group(r: Runner) -> Group:
    from exod.runner.group.membership import connect

    assert r.spec.group is not None
    g = connect(r.spec.shard.rank, r.spec.shard.world, r.spec.group, r.life, r.report)
    log(f"joined the group: rank {g.rank} of {g.size} ({r.spec.group.backend})")
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

    return BatchEngine(model, tokenizer, width=r.spec.width,
                       cache_bytes=r.options.prompt_cache_bytes, prefill_step=DEFAULT_PREFILL_STEP,
                       grammar_limits=r.options.grammar, kv=kv,
                       on_new_generator=lambda: set_wired_limit(r), disk=disk, agree=agree)


def disk_tier(r: Runner, loaded: Loaded) -> DiskTier | None:
    """The prompt cache's disk tier of this rank, opening (on its own thread): its folder is
    named by everything that makes a stored KV valid (exod.runner.prompt_cache.fingerprint)."""
    import mlx.core as mx
    import mlx_lm

    from exod.runner.cpu import fused
    from exod.runner.prompt_cache import fingerprint as fp
    from exod.runner.prompt_cache.disk import DiskTier

    opts, folder = r.options, r.spec.prompt_cache_folder
    if folder is None or opts.prompt_cache_disk_bytes <= 0:
        return None
    shard = loaded.shard
    tier = DiskTier(folder, shard.rank, opts.prompt_cache_disk_bytes,
                    max_queued=max(256 << 20, opts.prompt_cache_bytes))
    tier.open({"format": fp.FORMAT_VERSION, "dtype": loaded.dtype, "layers": shard.arg(),
               "total_layers": shard.total, "world": shard.world,
               "parallelism": r.spec.parallelism, "kv_bits": opts.kv_bits,
               "kv_group_size": opts.kv_group_size, "quantized_kv_start": opts.quantized_kv_start,
               "max_kv_size": opts.max_kv_size, "fused": fused.install(),
               "mlx": getattr(mx, "__version__", ""), "mlx_lm": mlx_lm.__version__},
              fp.weight_files(r.spec.model, opts.adapters))
    r.life.on_stop(lambda: setattr(tier, "stopping", True))  # a long hash ends at a stop
    tier.on_change = lambda: r.channel.inbox.put(None)  # the loop wakes to report it
    return tier


def wait_settled(disk: DiskTier | None) -> None:
    """Before READY: let the disk tier open when that is quick (its weights' hashes are
    recorded), so the first request after a restart finds what was kept; a tier that must hash
    the weights first does it while the instance serves."""
    if disk is not None:
        disk.settled.wait(SETTLE_LIMIT)


def warm(r: Runner, engine: BatchEngine | LeaderEngine, tokenizer: Any) -> None:
    """The instance's `warm:` prompts into the prompt cache (prefilled as the loop steps): rank
    0's to do (the other ranks of a group replay what it decides)."""
    from exod.config.warm import read_warm
    from exod.runner.serving.prepare import chat_prompt

    for path in r.options.warm:
        try:
            got = read_warm(path)
            tokens = chat_prompt(tokenizer, got.messages, got.tools,
                                 dict(r.spec.chat_template_kwargs), answer=False)
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
        wired.apply(r.options.wired_limit)
    except wired.WiredLimitError as e:
        raise ModelError(str(e)) from e


def serve_alone(r: Runner, loaded: Loaded, kv: KvOptions, draft: Draft | None) -> None:
    from exod.runner.serving import can_batch
    from exod.runner.serving.turn_engine import TurnEngine
    from exod.runner.serving.loop import Engine, ServeLoop

    why = can_batch.why_not(loaded.model) or options_reason(r.options)
    engine: Engine
    set_wired_limit(r)
    batch = None
    if why is None:
        disk = disk_tier(r, loaded)
        engine = batch = make_engine(r, loaded.model, loaded.tokenizer, kv, disk)
        wait_settled(disk)
    else:
        log(f"serving one request at a time: {why}")
        engine = TurnEngine(loaded.model, loaded.tokenizer, r.spec.width,
                            DEFAULT_PREFILL_STEP, why=f"one request at a time: {why}",
                            grammar_limits=r.options.grammar, kv=kv, draft=draft)
    ready(r, loaded)
    loop = ServeLoop(engine, r.channel, r.life, r.report, r.spec.heartbeat)
    if batch is not None:
        warm(r, batch, loaded.tokenizer)
    loop.run()
    engine.save_cache(loop.flush_deadline())


def options_reason(opts: RunnerOptions) -> str | None:
    """An option mlx-lm runs only without batching: the rule `exod check` shows."""
    from exod.config.mlx_options import turn_reason

    return turn_reason(opts)


def generation_options(r: Runner, loaded: Loaded) -> tuple[KvOptions, Draft | None]:
    """The KV cache options and the draft model, each checked against the model (a
    ModelError says why one cannot work, before READY)."""
    from exod.runner.load import ModelError, load_draft
    from exod.runner.serving.gen_options import Draft, KvOptions
    from exod.runner.serving.model_checks import model_vocab

    opts = r.options
    kv = KvOptions(opts.kv_bits, opts.kv_group_size, opts.quantized_kv_start, opts.max_kv_size)
    why = kv.problem(loaded.model)
    if why is not None:
        raise ModelError(why)
    if opts.draft_model is None:
        return kv, None
    r.report.status(m.Phase.LOADING, f"loading the draft model {opts.draft_model}")
    draft = Draft(load_draft(opts.draft_model, loaded.dtype), opts.num_draft_tokens)
    why = draft.problem(loaded.model, model_vocab(loaded.model), model_vocab(draft.model))
    if why is not None:
        raise ModelError(why)
    log(f"speculative decoding with {opts.draft_model}, {opts.num_draft_tokens} draft tokens")
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
        engine = follow(model, loaded.tokenizer, group, r.life, r.options.grammar,
                        make_disk=lambda: disk)
        if engine is not None:
            engine.save_cache(flush_deadline(r.channel))
        return
    leader = LeaderEngine(make_engine(r, model, loaded.tokenizer, disk=disk,
                                      agree=agreement(group)), group)
    loop = ServeLoop(leader, r.channel, r.life, r.report, r.spec.heartbeat,
                     tick=Ticker(leader.heartbeat, group.heartbeat_every))
    warm(r, leader, loaded.tokenizer)
    loop.run()
    try:  # first: every rank then writes its own part of the cache at once
        leader.shutdown()
    except PeerLost as e:  # stopping anyway; a peer that left first is no failure
        log(f"group shutdown: {e}")
    leader.save_cache(loop.flush_deadline())


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
