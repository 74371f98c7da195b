"""The runner's path for a model that sees (exod.config.vision tells which): load it with
mlx-vlm, put one token through it, then serve it with the vision engine behind the same serve
loop as text. One rank only for now, and without mlx-lm's generation options (a quantized or
rotating KV cache, a draft model, adapters): each is refused before loading, with the reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from exod import messages as m
from exod.core.exits import EXIT_MODEL, EXIT_OK, EXIT_UNAVAILABLE
from exod.core.serving import DEFAULT_PREFILL_STEP
from exod.runner.channel import Channel
from exod.runner.lifecycle import Lifecycle
from exod.runner.log import log
from exod.runner.report import Reporter
from exod.specs import RunnerSpec

if TYPE_CHECKING:
    from exod.runner.vision.load import LoadedVision


class Runner(Protocol):
    """What a runner's life gives this path (exod.runner.__main__.Runner)."""

    spec: RunnerSpec
    life: Lifecycle
    channel: Channel
    report: Reporter

# Bytes of vision tower output kept for the next turns about the same pictures.
FEATURE_CACHE_BYTES = 256 << 20


def serve(r: Runner, blas_msg: str) -> tuple[int, str]:
    """Load, then serve until asked to stop: (exit code, why it failed)."""
    try:
        from exod.runner.load import LoadAborted, ModelError
        from exod.runner.vision.load import load_vision
    except ImportError as e:
        return EXIT_UNAVAILABLE, f"mlx-vlm is not usable: {e} (pip install 'exod[vision]')"
    model = r.spec.model
    why = unsupported(r)
    if why is not None:
        return EXIT_MODEL, f"cannot serve {model}: {why}"
    try:
        log(f"loading {model} (a model that sees, through mlx-vlm)")
        loaded = load_vision(model, dtype=r.spec.options.dtype, progress=r.report.progress,
                             should_stop=r.life.stop.is_set)
        log(f"loaded {loaded.layers} layers and the vision tower in {loaded.seconds:.2f}s as "
            f"{loaded.dtype}; {blas_msg}")
        r.report.status(m.Phase.WAITING, "generating a first token")
        first_token(loaded)
        run_loop(r, loaded)
    except LoadAborted:
        log(f"stopped during load ({r.life.reason})")
    except ModelError as e:
        return EXIT_MODEL, f"cannot load {model}: {e}"
    return EXIT_OK, ""


def unsupported(r: Runner) -> str | None:
    opts = r.spec.options
    if r.spec.shard.world > 1:
        return "a model that sees runs on one rank for now (shards: 1)"
    for flag, value in (("kv_bits", opts.kv_bits), ("max_kv_size", opts.max_kv_size),
                        ("draft_model", opts.draft_model), ("adapters", opts.adapters)):
        if value is not None:
            return f"{flag} is not supported yet for a model that sees"
    return None


def first_token(loaded: LoadedVision) -> None:
    """READY means it can generate: one token through the language model first."""
    import mlx.core as mx
    from mlx_vlm.models.cache import make_prompt_cache

    from exod.runner.load import ModelError

    tok = loaded.tokenizer
    first = next((t for t in (getattr(tok, "bos_token_id", None),
                              getattr(tok, "eos_token_id", None)) if isinstance(t, int)), 0)
    lm = loaded.model.language_model
    try:
        mx.eval(lm(mx.array([[first]]), cache=make_prompt_cache(lm)).logits)
    except Exception as e:  # noqa: BLE001 -- whatever the family raises, the reason is kept
        raise ModelError(f"the first token failed: {type(e).__name__}: {e}") from e


def run_loop(r: Runner, loaded: LoadedVision) -> None:
    from exod.runner import wired
    from exod.runner.load import ModelError
    from exod.runner.serving.loop import ServeLoop
    from exod.runner.vision.engine import VisionEngine

    spec = r.spec

    def wired_limit() -> None:
        try:
            wired.apply(spec.options.wired_limit)
        except wired.WiredLimitError as e:
            raise ModelError(str(e)) from e

    wired_limit()
    engine = VisionEngine(loaded.model, loaded.processor, loaded.tokenizer,
                          width=spec.width, prefill_step=DEFAULT_PREFILL_STEP,
                          grammar_limits=spec.options.grammar,
                          feature_bytes=FEATURE_CACHE_BYTES, on_new_generator=wired_limit)
    r.report.ready(vocab_size=engine.vocab, context_length=engine.window or 0)
    ServeLoop(engine, r.channel, r.life, r.report, spec.heartbeat).run()
