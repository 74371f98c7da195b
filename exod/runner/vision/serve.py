"""The runner's path for a model that sees (exod.facts.vision tells which): load it with
mlx-vlm, put one token through it, then serve it with the vision engine behind the same serve
loop as text. Split across the ranks of a pipeline group, every rank runs the same engine in
step (exod.runner.vision.group), the vision tower on rank 0. mlx-lm's generation options (a
quantized or rotating KV cache, a draft model, adapters) are refused before loading, with the
reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from exod.wire import messages as m
from exod.core import memory
from exod.core.exits import (EXIT_MODEL, EXIT_OK, EXIT_PEER_LOST, EXIT_TEMPFAIL,
                             EXIT_UNAVAILABLE)
from exod.core.serving import DEFAULT_PREFILL_STEP
from exod.runner.channel import Channel
from exod.runner.lifecycle import Lifecycle
from exod.runner.log import log
from exod.runner.report import Reporter
from exod.wire.specs import RunnerSpec

if TYPE_CHECKING:
    from exod.runner.group.membership import Group
    from exod.runner.group.plan import Settings
    from exod.runner.vision.engine import VisionEngine
    from exod.runner.vision.load import LoadedVision


class Runner(Protocol):
    """What a runner's life gives this path (exod.runner.text.Runner)."""

    spec: RunnerSpec
    life: Lifecycle
    channel: Channel
    report: Reporter

# Bytes of vision tower output kept for the next turns about the same pictures.
FEATURE_CACHE_BYTES = memory.FEATURE_CACHE_BYTES


def serve(r: Runner, blas_msg: str) -> tuple[int, str]:
    """Load, then serve until asked to stop: (exit code, why it failed)."""
    try:
        from exod.runner.cpu import fused, split
        from exod.runner.group.membership import AddressInUse, PeerLost
        from exod.runner.load import LoadAborted, ModelError
        from exod.runner.vision.load import load_vision
    except ImportError as e:
        return EXIT_UNAVAILABLE, f"mlx-vlm is not usable: {e} (pip install 'exod[vision]')"
    spec = r.spec
    why = unsupported(spec)
    if why is not None:
        return EXIT_MODEL, f"cannot serve {spec.model}: {why}"
    # The language model's decode steps run the fused rope and norms as text models do (the
    # vision tower's calls are not decode-shaped and keep mlx's own): bitwise the same tokens,
    # ~5% more tokens/s on bench vision's Qwen2.5-VL.
    blas_msg += fused.install_note()
    try:
        group = join(r) if spec.group is not None else None
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
    except LoadAborted:
        log(f"stopped during load ({r.life.reason})")
    except ModelError as e:
        return EXIT_MODEL, f"cannot load {spec.model}: {e}"
    except AddressInUse as e:
        return EXIT_TEMPFAIL, f"address {e} is in use (another instance or program on its port?)"
    except PeerLost as e:
        return EXIT_PEER_LOST, f"peer lost: {e}; exiting so the group can form again"
    return EXIT_OK, ""


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


def join(r: Runner) -> Group:
    from exod.runner.group.membership import connect

    spec = r.spec
    assert spec.group is not None
    g = connect(spec.shard.rank, spec.shard.world, spec.group, r.life, r.report)
    log(f"joined the group: rank {g.rank} of {g.size} ({spec.group.backend})")
    return g


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

    from exod.runner.group.membership import PeerLost
    from exod.runner.load import ModelError

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
    from exod.runner import wired
    from exod.runner.load import ModelError
    from exod.runner.serving.loop import ServeLoop, Ticker
    from exod.runner.vision.engine import VisionEngine, sizes
    from exod.runner.vision.group import VisionLeader, follow_vision

    spec, opts = r.spec, r.spec.options
    # What memory admission counted for the pictures held at the model's resolution.
    picture_bytes = memory.picture_budget(tower(spec.model))

    def wired_limit() -> None:
        try:
            wired.apply(opts.wired_limit)
        except wired.WiredLimitError as e:
            raise ModelError(str(e)) from e

    def engine(width: int, cache_bytes: int, prefill_step: int) -> VisionEngine:
        return VisionEngine(loaded.model, loaded.processor, loaded.tokenizer, width=width,
                            prefill_step=prefill_step, grammar_limits=opts.grammar,
                            feature_bytes=FEATURE_CACHE_BYTES, cache_bytes=cache_bytes,
                            on_new_generator=wired_limit,
                            language_model=language_model(loaded, group),
                            picture_bytes=picture_bytes)

    wired_limit()
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
    from exod.runner.group.membership import PeerLost

    leader = VisionLeader(served, group)
    ServeLoop(leader, r.channel, r.life, r.report, spec.heartbeat,
              tick=Ticker(leader.heartbeat, group.heartbeat_every)).run()
    try:
        leader.shutdown()
    except PeerLost as e:  # stopping anyway; a peer that left first is no failure
        log(f"group shutdown: {e}")
