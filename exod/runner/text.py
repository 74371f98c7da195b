"""The runner's path for a text model (mlx-lm): load its layers, join its group, put a first
token through every rank, then serve it alone (continuous batching, or one request at a time when
the model or its options cannot batch) or in step with its group (exod.runner.group.lockstep).
`Runner` is what every stage of a runner's life needs (the vision and embedding paths take the
same)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exod.wire import messages as m
from exod.wire.options import RunnerOptions
from exod.core.serving import DEFAULT_PREFILL_STEP
from exod.core.shards import Shard
from exod.runner.channel import Channel
from exod.runner.lifecycle import Lifecycle
from exod.runner.log import WARNING, log
from exod.runner.report import Reporter
from exod.wire.specs import RunnerSpec

if TYPE_CHECKING:
    from exod.runner.group.lockstep import LeaderEngine
    from exod.runner.prompt_cache.disk import DiskTier
    from exod.runner.serving.batch_engine import BatchEngine
    from exod.runner.serving.disk_loads import Agree
    from exod.runner.load import Loaded
    from exod.runner.group.membership import Group
    from exod.runner.serving.gen_options import Draft, KvOptions

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


def make_shard(spec: RunnerSpec, total: int) -> Shard:
    """The spec's layers; all `total` of them when the daemon could not count them."""
    s = spec.shard
    return s if s.total else Shard(s.rank, s.world, 0, total, total)


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
                    max_queued=max(256 << 20, opts.prompt_cache_bytes), solo=shard.world == 1)
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
    from exod.facts.model_dir import model_layer_count

    n = model_layer_count(model)
    return n if n is not None else 0
