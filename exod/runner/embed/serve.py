"""The runner's path for an embedding model or a reranker (the daemon says so in the spec's
`kind`, from exod.facts.embed; how it makes vectors comes from the same files): load it with
mlx-vlm's encoder loader, run one input through it, then serve it with the embedding engine
behind the same serve loop as text. One rank, and none of mlx-lm's generation options
(it generates no tokens): each is refused before loading, with the reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from exod.core.serving import EMBED_BATCH_TOKENS, EMBED_MAX_BATCH
from exod.facts.embed import ENDPOINTS, Encoding, encoding
from exod.runner.failures import CannotServe, ModelError, Unavailable
from exod.runner.link.log import log
from exod.runner.runner import Runner
from exod.wire import messages as m

if TYPE_CHECKING:
    from exod.runner.embed.engine import EmbedEngine as EmbedEngineT
    from exod.runner.embed.load import LoadedEncoder


def serve(r: Runner, blas_msg: str) -> None:
    """Load, then serve until asked to stop."""
    model = r.spec.model
    enc = encoding(model)
    if enc is None:
        raise CannotServe("it is no longer an embedding model")
    try:
        from exod.runner.embed.load import load_encoder
    except ImportError as e:
        raise Unavailable(f"mlx-vlm is not usable: {e} (pip install 'exod[vision]')") from e
    why = enc.problem or unsupported(r)
    if why is not None:
        raise CannotServe(why)
    log(f"loading {model} ({ENDPOINTS[enc.role]}: {enc.why}, through mlx-vlm)")
    loaded = load_encoder(model, enc, dtype=r.spec.options.dtype,
                          progress=r.report.progress, should_stop=r.life.stop.is_set)
    log(f"loaded {loaded.layers} layers in {loaded.seconds:.2f}s as {loaded.dtype}; "
        f"{blas_msg}")
    r.report.status(m.Phase.WAITING, "encoding a first input")
    engine = make_engine(r, loaded)
    split = engine.encoder.split
    log(f"a step's forward passes run on {engine.encoder.threads} thread(s); "
        + (f"a pass alone: {split.describe()}" if split is not None else "activations whole"))
    first_input(engine)
    run_loop(r, engine, enc)


def unsupported(r: Runner) -> str | None:
    opts = r.spec.options
    if r.spec.shard.world > 1:
        return "an embedding model or a reranker runs on one rank (shards: 1)"
    for flag, value in (("kv_bits", opts.kv_bits), ("max_kv_size", opts.max_kv_size),
                        ("draft_model", opts.draft_model), ("adapters", opts.adapters)):
        if value is not None:
            return f"{flag} is a generation option: this model generates no tokens"
    return None


def make_engine(r: Runner, loaded: LoadedEncoder) -> EmbedEngineT:
    from exod.runner.embed.encoder import Encoder, threads
    from exod.runner.embed.engine import EmbedEngine

    tok = loaded.tokenizer
    config = getattr(loaded.model, "config", None)
    pad = tok.pad_token_id if isinstance(tok.pad_token_id, int) else \
        getattr(config, "pad_token_id", None)
    vocab = int(getattr(config, "vocab_size", 0) or len(tok))
    encoder = Encoder(loaded.model, loaded.encoding, pad if isinstance(pad, int) else 0,
                      threads())
    return EmbedEngine(encoder, tok, vocab, width=r.spec.width,
                       batch_tokens=EMBED_BATCH_TOKENS, max_batch=EMBED_MAX_BATCH)


def first_input(engine: EmbedEngineT) -> None:
    """READY means it can answer: one input through the model first."""
    probe = m.Embed(id="first", kind=engine.enc.role, texts=["exod"],
                    query="exod" if engine.enc.role == "rerank" else None)
    try:
        engine.admit(probe, engine.read(probe))
        engine.step()
    except Exception as e:  # noqa: BLE001 -- whatever the family raises, the reason is kept
        raise ModelError(f"the first input failed: {type(e).__name__}: {e}") from e
    engine.figures.batches = engine.figures.inputs = 0


def run_loop(r: Runner, engine: EmbedEngineT, enc: Encoding) -> None:
    from exod.runner.serving.loop import ServeLoop

    r.set_wired_limit()
    r.report.ready(vocab_size=engine.vocab, context_length=enc.max_tokens)
    ServeLoop(engine, r.channel, r.life, r.report, r.spec.heartbeat, takes=m.Embed,
              refusal=f"this instance serves {ENDPOINTS[enc.role]}, not chat or "
                      "completions").run()
