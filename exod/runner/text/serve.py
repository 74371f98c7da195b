"""A text model's path from its spec to serving (mlx-lm): load its layers, join its group, put a
first token through every rank, then serve it alone (continuous batching, or one request at a
time when the model or its options cannot batch) or in step with its group
(exod.runner.group.lockstep). What ends it early is one of exod.runner.failures."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from exod.core.serving import DEFAULT_PREFILL_STEP
from exod.core.shards import Shard
from exod.runner.failures import ModelError, PeerLost, Unavailable
from exod.runner.link.log import log
from exod.runner.runner import Runner, join_group
from exod.runner.text.cache import disk_tier, wait_settled, warm
from exod.runner.text.options import generation_options, group_problem, options_reason
from exod.wire import messages as m
from exod.wire.specs import RunnerSpec

if TYPE_CHECKING:
    from exod.runner.group.membership import Group
    from exod.runner.load import Loaded
    from exod.runner.prompt_cache.disk import DiskTier
    from exod.runner.serving.batch_engine import BatchEngine
    from exod.runner.serving.disk_loads import Agree
    from exod.runner.serving.gen_options import Draft, KvOptions


def serve(r: Runner, blas_msg: str) -> None:
    """Load, then serve until asked to stop."""
    try:
        importlib.import_module("exod.runner.text.load")  # mlx, or why it cannot be used
    except ImportError as e:
        raise Unavailable(f"mlx is not usable: {e}") from e
    from exod.runner.cpu import fused, split

    blas_msg += fused.install_note()
    group = join_group(r) if r.spec.group is not None else None
    loaded = load(r, group)
    log(f"loaded {loaded.shard.count} layers in {loaded.seconds:.2f}s as {loaded.dtype}; "
        f"{blas_msg}")
    log(split.here(loaded.model))
    if group is None:
        options = generation_options(r, loaded)  # the draft loads here, before READY
    else:
        why = group_problem(r.options)
        if why is not None:
            raise ModelError(why)
    first_token(r, loaded, group)
    if group is None:
        serve_alone(r, loaded, *options)
    else:
        serve_group(r, loaded, group)


def make_shard(spec: RunnerSpec, total: int) -> Shard:
    """The spec's layers; all `total` of them when the daemon could not count them."""
    s = spec.shard
    return s if s.total else Shard(s.rank, s.world, 0, total, total)


def load(r: Runner, group: Group | None) -> Loaded:
    from exod.facts.model_dir import model_layer_count
    from exod.runner.text.load import load_shard

    spec = r.spec
    shard = make_shard(spec, spec.shard.total or model_layer_count(spec.model) or 0)
    log(f"loading {spec.model} layers [{shard.start}, {shard.end}) of {shard.total}"
        f" ({spec.parallelism}, rank {shard.rank}/{shard.world})")
    return load_shard(
        spec.model, shard, parallelism=spec.parallelism, dtype=r.options.dtype,
        progress=r.report.progress, should_stop=r.life.stop.is_set,
        group=group.group if group is not None else None, adapters=r.options.adapters,
    )


def first_token(r: Runner, loaded: Loaded, group: Group | None) -> None:
    """READY means it can generate: one real token goes through every rank first (once every
    rank has loaded, so no timeout runs while a peer is still loading). Raises ModelError."""
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
                disk: DiskTier | None = None, agree: Agree | None = None,
                draft: Draft | None = None) -> BatchEngine:
    from exod.runner.serving.batch_engine import BatchEngine

    return BatchEngine(model, tokenizer, width=r.spec.width,
                       cache_bytes=r.options.prompt_cache_bytes, prefill_step=DEFAULT_PREFILL_STEP,
                       grammar_limits=r.options.grammar, kv=kv, draft=draft,
                       on_new_generator=r.set_wired_limit, disk=disk, agree=agree)


def serve_alone(r: Runner, loaded: Loaded, kv: KvOptions, draft: Draft | None) -> None:
    from exod.runner.serving import can_batch
    from exod.runner.serving.loop import Engine, ServeLoop
    from exod.runner.serving.turn_engine import TurnEngine

    why = can_batch.why_not(loaded.model) or options_reason(r.options)
    if why is None and draft is not None:
        from exod.runner.serving import speculative

        why = speculative.why_not(loaded.model, draft)
    engine: Engine
    r.set_wired_limit()
    batch = None
    if why is None:
        disk = disk_tier(r, loaded)
        engine = batch = make_engine(r, loaded.model, loaded.tokenizer, kv, disk, draft=draft)
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


def serve_group(r: Runner, loaded: Loaded, group: Group) -> None:
    """Every rank runs the same engine on the same requests: rank 0 serves and sends the
    others its plans, which they replay (exod.runner.group.lockstep). The group has already
    passed its barrier and a first token (`first_token`)."""
    from exod.runner.group.group_model import GroupModel
    from exod.runner.group.lockstep import LeaderEngine, agreement, follow
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
