"""`python -m exod.runner.split.probe --channel-fd N`: does this layout of this model work?
Answered by running the code that will run, on the family built from config.json with no weights.

mlx builds graphs lazily and checks shapes as it builds them, so the probe constructs the model
(random weights that are never evaluated: nothing is computed or allocated), applies the split
each rank would apply (stand-ins for a pipeline rank, the tensor sharding for a tensor rank),
and calls the model's forward on a few tokens with its own cache, without evaluating anything.
A missing list of blocks, head counts that do not divide, a block whose output is not the
hidden state, a projection reshaped to the full width after sharding: all of them fail there.

The question comes on its channel (`exod.wire.specs.ProbeAsk`, after its hello), the answer goes
back there: one `ProbeAnswer`, a `Verdict` per layout, `unknown` when mlx-lm cannot even build the
model from that config. A refusal's reason is in words (exod.runner.split.wording); `detail`
keeps the raw error it was translated from. The daemon and `exod check` ask it (exod.wire.ask:
they never import mlx) and cache the answer.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from collections.abc import Callable
from typing import Any

from exod.wire.child_end import ChildEnd
from exod.facts.vision import SPLIT_BY_LAYERS, sees
from exod.core.exits import EXIT_USAGE
from exod.core.shards import Shard, pipeline_shards, tensor_shards
from exod.runner.start import import_table
from exod.runner.split.wording import explain
from exod.wire.specs import PROBE_FIRST, ProbeAnswer, ProbeAsk, Verdict

ASK_WAIT = 60.0  # the question comes as soon as the asker reads the hello


class FakeGroup:
    """What the sharding code asks of a group (its size and this rank), for a rank that does
    not exist; replaced by the real one-process group before the forward is built."""

    def __init__(self, rank: int, size: int) -> None:
        self._rank, self._size = rank, size

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size


def probe(model_dir: Path, shards: int, parallelism: str,
          layers: tuple[int, ...] | None = None) -> Verdict:
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    kind = str(config.get("model_type") or "?")
    if sees(model_dir) is not None:
        return _probe_vision(config, kind, shards, parallelism, layers)
    if shards > 1:
        unbatchable = _why_not_batchable(config)
        if unbatchable is not None:
            return Verdict(ok=False, model_type=kind, detail=None,
                           reason=f"a group's ranks serve in one batch, and {unbatchable} "
                                  "(1 rank serves it, one request at a time)")
    for rank in sorted({0, shards - 1}):
        try:
            model = _build(config)
        # SystemExit too: mlx-lm's olmo module exits the process when hf_olmo is missing,
        # which would lose the answers to every other layout of the batch.
        except (Exception, SystemExit) as e:  # noqa: BLE001 -- the runner will say
            return Verdict(ok=False, unknown=True, reason=f"{type(e).__name__}: {e}",
                           detail=None, model_type=kind)
        try:
            _try_rank(model, rank, shards, parallelism, layers)
        except Exception as e:  # noqa: BLE001 -- the reason is the answer
            why = explain(e, parallelism)
            return Verdict(ok=False, reason=why.reason, detail=why.detail, model_type=kind)
    return Verdict(ok=True, reason=None, detail=None, model_type=kind)


DEEPSTACK = ("its vision tower's features go into the language model's first layers too "
             "(deepstack), which only rank 0 has: a model that sees splits only when the "
             "language model takes the pictures' embeddings alone (serve it with shards: 1)")


def _probe_vision(config: dict[str, Any], kind: str, shards: int, parallelism: str,
                  layers: tuple[int, ...] | None) -> Verdict:
    """A model that sees (built by mlx-vlm, exod.runner.vision.load.build): its language
    model's layers split as a text model's; its tower runs whole on rank 0."""
    if shards > 1 and parallelism != "pipeline":
        return Verdict(ok=False, reason=SPLIT_BY_LAYERS, detail=None, model_type=kind)
    vision = config.get("vision_config")
    if shards > 1 and isinstance(vision, dict) and vision.get("deepstack_visual_indexes"):
        return Verdict(ok=False, reason=DEEPSTACK, detail=None, model_type=kind)
    from exod.runner.vision.load import build, probe_forward

    for rank in sorted({0, shards - 1}):
        try:
            model = build(config)
        except (Exception, SystemExit) as e:  # noqa: BLE001 -- the runner will say
            return Verdict(ok=False, reason=f"{type(e).__name__}: {e}", detail=None,
                           model_type=kind, unknown=True)
        try:
            _try_rank(model, rank, shards, parallelism, layers, probe_forward)
        except Exception as e:  # noqa: BLE001 -- the reason is the answer
            why = explain(e, parallelism)
            return Verdict(ok=False, reason=why.reason, detail=why.detail, model_type=kind)
    return Verdict(ok=True, reason=None, detail=None, model_type=kind)


def _why_not_batchable(config: dict[str, Any]) -> str | None:
    from exod.runner.serving import can_batch

    try:
        return can_batch.why_not(_build(config))
    except (Exception, SystemExit):  # noqa: BLE001 -- not this check's question: asked below
        return None


class ProbeError(Exception):
    pass


def _build(config: dict[str, Any]) -> Any:
    from mlx import nn
    from mlx_lm.utils import _get_classes

    model_cls, args_cls = _get_classes(config)
    model = model_cls(args_cls.from_dict(config))
    q = config.get("quantization") or config.get("quantization_config")
    if isinstance(q, dict) and "bits" in q:
        gs = int(q.get("group_size", 64))

        def fits(path: str, m: Any) -> bool | dict[str, Any]:
            if path in q:  # mixed precision: mlx-lm's convert writes one entry per layer
                own = q[path]
                return own if isinstance(own, dict) else bool(own)
            w = getattr(m, "weight", None)
            return hasattr(m, "to_quantized") and w is not None and w.shape[-1] % gs == 0

        nn.quantize(model, group_size=gs, bits=int(q["bits"]), class_predicate=fits)
    return model


def _try_rank(model: Any, rank: int, size: int, parallelism: str,
              layers: tuple[int, ...] | None,
              forward: Callable[[Any], Any] | None = None) -> None:
    import mlx.core as mx

    from exod.runner.split import pipeline
    from exod.runner.split.blocks import find_blocks
    from exod.runner.split.tensor import block_sharder

    run = forward or _forward
    blocks = find_blocks(model)
    total = len(blocks.items)
    if parallelism == "pipeline":
        if layers is None and size > total:
            raise ProbeError(f"{size} ranks but the model has only {total} layers: "
                             "a pipeline rank needs at least one layer")
        shards = pipeline_shards(total, size, layers)
        shard: Shard = shards[rank]
        problem = pipeline.handoff_problem(blocks, lambda: run(model), shards)
        if problem is not None:
            raise ProbeError(problem)
        pipeline.install(blocks, shard, None)
    else:
        fake = FakeGroup(rank, size)
        one = block_sharder(model, blocks, fake)
        for block in list(blocks.items):
            one(block)
        _replace_group(model, fake, mx.distributed.init())
        shard = tensor_shards(total, size)[rank]
    out = run(model)
    if out.ndim != 3 or out.shape[1] != 3:
        raise ProbeError(f"the forward gives shape {tuple(out.shape)}, not (1, 3, vocab)")


def _forward(model: Any) -> Any:
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    tokens = mx.array([[1, 2, 3]], dtype=mx.int32)
    return model(tokens, cache=make_prompt_cache(model))  # built, never evaluated


def _replace_group(model: Any, fake: FakeGroup, real: Any) -> None:
    for m in model.modules():
        for k, v in list(vars(m).items()):
            if v is fake:
                setattr(m, k, real)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m exod.runner.split.probe", description=__doc__)
    p.add_argument("--channel-fd", type=int, default=None, help="where the question comes")
    end: ChildEnd[ProbeAsk] = ChildEnd(p.parse_args(argv).channel_fd, PROBE_FIRST, {})
    # Whoever asked is gone (it gave up): nobody wants the answer.
    end.start(lambda msg: None, lambda why: os._exit(0))
    question = end.spec(ASK_WAIT)
    if question is None:
        print("no question on the channel (--channel-fd): exod and `exod check` ask it",
              file=sys.stderr)
        return EXIT_USAGE
    import_table.install()  # before mlx_lm imports transformers
    end.send(ProbeAnswer([_answer(a.model, a.shards, a.parallelism, a.layers or None)
                          for a in question.layouts]))
    return 0


def _answer(model: Path, shards: int, parallelism: str,
            layers: tuple[int, ...] | None) -> Verdict:
    try:
        return probe(model, shards, parallelism, layers)
    except (OSError, ValueError, KeyError) as e:
        return Verdict(ok=False, unknown=True, reason=f"cannot read the model's config: {e}",
                       detail=None, model_type=None)


if __name__ == "__main__":
    sys.exit(main())
