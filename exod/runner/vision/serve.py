"""The runner's path for a model that sees (the daemon says so in the spec's `kind`, from
exod.facts.vision): load it with
mlx-vlm, put one token through it, then serve it with the vision engine behind the same serve
loop as text. Split across the ranks of a pipeline group, every rank runs the same engine in
step (exod.runner.vision.group), the vision tower on rank 0. mlx-lm's generation options (a
quantized or rotating KV cache, a draft model, adapters) are refused before loading, with the
reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from exod.core import memory
from exod.core.serving import DEFAULT_PREFILL_STEP
from exod.runner.failures import CannotServe, ModelError, PeerLost, Unavailable
from exod.runner.link.log import log
from exod.runner.runner import Runner, join_group
from exod.wire import messages as m
from exod.wire.specs import RunnerSpec

if TYPE_CHECKING:
    from exod.runner.group.membership import Group
    from exod.runner.group.plan import Settings
    from exod.runner.vision.engine import VisionEngine
    from exod.runner.vision.load import LoadedVision

# Bytes of vision tower output kept for the next turns about the same pictures.
FEATURE_CACHE_BYTES = memory.FEATURE_CACHE_BYTES


def serve(r: Runner, blas_msg: str) -> None:
    """Load, then serve until asked to stop."""
    try:
        from exod.runner.cpu import fused, split
        from exod.runner.vision.load import load_vision
    except ImportError as e:
        raise Unavailable(f"mlx-vlm is not usable: {e} (pip install 'exod[vision]')") from e
    spec = r.spec
    why = unsupported(spec)
    if why is not None:
        raise CannotServe(why)
    # The language model's decode steps run the fused rope and norms as text models do (the
    # vision tower's calls are not decode-shaped and keep mlx's own): bitwise the same tokens,
    # faster (`python -m bench vision`; docs/benchmarks.md).
    blas_msg += fused.install_note()
    group = join_group(r) if spec.group is not None else None
    where = f", rank {spec.shard.rank} of {spec.shard.world}" if group is not None else ""
    log(f"loading {spec.model} (a model that sees, through mlx-vlm){where}")
    loaded = load_vision(spec.model, dtype=spec.options.dtype, progress=r.report.progress,
                         should_stop=r.life.stop.is_set, shard=spec.shard,
                         group=group.group if group is not None else None)
    owned = loaded.shard.count if loaded.shard is not None else loaded.layers
    tower = "" if loaded.shard is not None and not loaded.shard.first \
        else " and the vision tower"
    log(f"loaded {owned} layers{tower} in {loaded.seconds:.2f}s as {loaded.dtype}; "
        f"{blas_msg}")
    log(split.here(loaded.model))
    first_token(r, loaded, group)
    run_loop(r, loaded, group)


def unsupported(spec: RunnerSpec) -> str | None:
    opts = spec.options
    if spec.shard.world > 1 and spec.parallelism != "pipeline":
        return ("a model that sees is split by layers only (parallelism: pipeline): its vision "
                "tower runs whole on rank 0")
    for flag, value in (("kv_bits", opts.kv_bits), ("max_kv_size", opts.max_kv_size),
                        ("draft_model", opts.draft_model), ("adapters", opts.adapters)):
        if value is not None:
            return f"{flag} is not supported yet for a model that sees"
    return None


def language_model(loaded: LoadedVision, group: Group | None) -> Any:
    """What the engine calls: the language model, or over a group, its forward with the
    group's communication (exod.runner.group.group_model)."""
    if group is None:
        return loaded.model.language_model
    from exod.runner.group.group_model import GroupModel
    from exod.runner.load import Loaded

    assert loaded.shard is not None
    return GroupModel(Loaded(loaded.model.language_model, loaded.tokenizer, loaded.shard,
                             loaded.dtype, loaded.seconds, loaded.link), group)


def first_token(r: Runner, loaded: LoadedVision, group: Group | None) -> None:
    """READY means it can generate: one token through the language model first (through
    every rank of a group, once they all have loaded)."""
    import mlx.core as mx
    from mlx_vlm.models.cache import make_prompt_cache

    if group is not None:
        r.report.status(m.Phase.WAITING,
                        f"waiting for the other {group.size - 1} rank(s) to load")
        group.wait_until_loaded(r.life)
        group.arm()
    r.report.status(m.Phase.WAITING, "generating a first token")
    tok = loaded.tokenizer
    first = next((t for t in (getattr(tok, "bos_token_id", None),
                              getattr(tok, "eos_token_id", None)) if isinstance(t, int)), 0)
    lm = loaded.model.language_model
    try:
        out = language_model(loaded, group)(mx.array([[first]]), cache=make_prompt_cache(lm))
        mx.eval(getattr(out, "logits", out))
    except PeerLost:
        raise
    except Exception as e:  # noqa: BLE001 -- whatever the family raises, the reason is kept
        raise ModelError(f"the first token failed: {type(e).__name__}: {e}") from e


def run_loop(r: Runner, loaded: LoadedVision, group: Group | None) -> None:
    from exod.facts.vision import tower
    from exod.runner.serving.loop import ServeLoop, Ticker
    from exod.runner.vision.engine import VisionEngine, sizes
    from exod.runner.vision.group import VisionLeader, follow_vision

    spec, opts = r.spec, r.spec.options
    # What memory admission counted for the pictures held at the model's resolution.
    picture_bytes = memory.picture_budget(tower(spec.model))

    def engine(width: int, cache_bytes: int, prefill_step: int) -> VisionEngine:
        return VisionEngine(loaded.model, loaded.processor, loaded.tokenizer, width=width,
                            prefill_step=prefill_step, grammar_limits=opts.grammar,
                            feature_bytes=FEATURE_CACHE_BYTES, cache_bytes=cache_bytes,
                            on_new_generator=r.set_wired_limit,
                            language_model=language_model(loaded, group),
                            picture_bytes=picture_bytes)

    r.set_wired_limit()
    vocab, window = sizes(loaded.model, loaded.tokenizer)
    r.report.ready(vocab_size=vocab, context_length=window or 0)
    if group is not None and group.rank != 0:
        def make(s: Settings) -> VisionEngine:
            return engine(s.width, s.cache_bytes, s.prefill_step)

        follow_vision(make, group, r.life)
        return
    served = engine(spec.width, opts.prompt_cache_bytes, DEFAULT_PREFILL_STEP)
    if group is None:
        ServeLoop(served, r.channel, r.life, r.report, spec.heartbeat).run()
        return
    leader = VisionLeader(served, group)
    ServeLoop(leader, r.channel, r.life, r.report, spec.heartbeat,
              tick=Ticker(leader.heartbeat, group.heartbeat_every)).run()
    try:
        leader.shutdown()
    except PeerLost as e:  # stopping anyway; a peer that left first is no failure
        log(f"group shutdown: {e}")
