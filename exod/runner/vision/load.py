"""Load a model that sees, as the text runner loads one (exod.runner.text.load): lazily first
(mlx-vlm reads the files' headers, names and quantizes the module tree), then the vision tower's
blocks one at a time, then what else lies outside the language model's blocks (the rest of the
tower, its projector, the embeddings and the head) and one block at a time, with progress after
each block, the tower's counted with the language model's, and no timer anywhere (a tower is up
to a tenth of a model: Qwen2.5-VL's 670M parameters).

A rank of a pipeline group keeps its own blocks only (exod.runner.split.pipeline: stand-ins for
the others, never read from disk); rank 0 reads the vision tower and its projector, whole, as
it loads (the other ranks never run them); what else lies outside the blocks is read as each
rank's first forward needs it (the embeddings on the first rank, the head on the last).

The one place that builds mlx-vlm models, for every user of them (`load_vision`, and `build`
for a model from its config alone, with no weights: the split probe).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx import nn

from exod.core.shards import Shard
from exod.runner.failures import LoadAborted, ModelError
from exod.runner.load import DTYPES, evaluate_weights, resolve_dtype
from exod.runner.split import pipeline
from exod.runner.split.blocks import NoBlocks, find_blocks, flat_arrays
from exod.runner.split.pipeline import PipeLink
from exod.runner.vision.features import TOWERS

# What joins a tower to the language model, read with the tower on rank 0.
PROJECTORS = ("multi_modal_projector", "connector", "mm_projector")


@dataclass
class LoadedVision:
    model: Any  # the family's mlx-vlm Model: vision tower, projector, language_model
    processor: Any  # its processor (the chat template, pictures into placeholders)
    tokenizer: Any  # mlx-lm's wrapper of the same tokenizer (detokenizer, markers)
    dtype: str
    seconds: float
    layers: int
    shard: Shard | None = None  # a group's rank: the layers it owns
    link: PipeLink | None = None  # a pipeline rank's connections to its neighbours


def load_vision(path: Path, *, dtype: str, progress: Callable[[int, int], None],
                should_stop: Callable[[], bool], shard: Shard | None = None,
                group: Any = None) -> LoadedVision:
    """ModelError for a directory mlx-vlm cannot load; LoadAborted when asked to stop.
    `shard` and `group` (an mx.distributed.Group): a rank of a pipeline group."""
    from mlx_lm.utils import load_tokenizer
    from mlx_vlm.utils import load

    t0 = time.monotonic()
    try:
        model, processor = load(str(path), lazy=True)
        eos = getattr(model.config, "eos_token_id", None)
        tokenizer = load_tokenizer(path, eos_token_ids=eos)
    except Exception as e:  # mlx-vlm and transformers raise many types for a bad directory
        raise ModelError(f"{type(e).__name__}: {e}") from e
    try:
        blocks = find_blocks(model)
    except NoBlocks as e:
        if shard is not None and shard.world > 1:
            raise ModelError(f"{e}: it cannot be split across ranks") from e
        blocks = None
    n = len(blocks.items) if blocks is not None else 0
    if shard is None or shard.world == 1:
        shard = Shard(0, 1, 0, n, n)
    elif shard.total not in (0, n):
        raise ModelError(f"the model has {n} layers, the shard plan assumed {shard.total}")
    elif shard.total == 0:
        shard = Shard(shard.rank, shard.world, 0, n, n)
    link = None
    if blocks is not None and shard.world > 1:
        link = PipeLink(group, shard.rank, shard.world) if group is not None else None
        pipeline.install(blocks, shard, link)  # before any eval: other ranks' blocks stay unread
    dt = resolve_dtype(dtype)
    if dt != "keep":
        model.set_dtype(DTYPES[dt])  # lazily: each weight is cast as it is read
    tower = tower_blocks(model) if shard.first else []
    owned = 0 if blocks is None else sum(not pipeline.is_stand_in(b) for b in blocks.items)
    k, total = len(tower), len(tower) + owned
    progress(0, total)
    try:
        for i, block in enumerate(tower, 1):
            if should_stop():
                raise LoadAborted()
            mx.eval(block.parameters())
            progress(i, total)
        if shard.world > 1 and shard.first:  # a pipeline rank reads no more up front
            mx.eval([getattr(model, name).parameters() for name in (*TOWERS, *PROJECTORS)
                     if getattr(model, name, None) is not None])
    except (LoadAborted, KeyboardInterrupt):
        raise
    except Exception as e:  # a truncated or corrupt file surfaces here, at eval
        raise ModelError(f"{type(e).__name__}: {e}") from e

    def language_done(i: int, n: int) -> None:  # its "0 of n" is the tower's last step
        if i:
            progress(k + i, k + n)
    evaluate_weights(model, blocks, shard, "pipeline", None, language_done, should_stop)
    return LoadedVision(model, processor, tokenizer, dt, time.monotonic() - t0, n,
                        shard if shard.world > 1 else None, link)


def tower_blocks(model: Any) -> list[nn.Module]:
    """The vision tower's blocks: the longest list of modules of one type inside it (Qwen's
    `blocks`, SigLIP's and CLIP's `encoder.layers`, Pixtral's `transformer.layers`; an MLP's
    list of layers and activations is not one), of two such lists the one with more
    parameters; none without a tower."""
    tower = next((t for name in TOWERS if (t := getattr(model, name, None)) is not None), None)
    best: list[nn.Module] = []
    best_key = (0, 0)
    stack = [tower] if isinstance(tower, nn.Module) else []
    while stack:
        module = stack.pop()
        for value in module.values():  # nn.Module is a dict of its children
            if isinstance(value, list):
                children = [v for v in value if isinstance(v, nn.Module)]
                stack.extend(children)
                if children and len(children) == len(value) \
                        and len({type(c) for c in children}) == 1:
                    key = (len(children), sum(a.size for c in children
                                              for _, a in flat_arrays(c.parameters())))
                    if key > best_key:
                        best, best_key = children, key
            elif isinstance(value, nn.Module):
                stack.append(value)
    return best


def build(config: dict[str, Any]) -> Any:
    """The family's mlx-vlm Model for `config` (config.json's object), as mlx-vlm's loader
    makes it, with weights that are never evaluated (nothing is allocated)."""
    from mlx_vlm.utils import get_model_and_args, update_module_configs

    config = json.loads(json.dumps(config))  # the loader edits its copy in place too
    module, _ = get_model_and_args(config)
    config.setdefault("text_config", config.pop("llm_config", {}))
    config.setdefault("vision_config", {})
    config.setdefault("audio_config", {})
    model_config = module.ModelConfig.from_dict(config)
    model_config = update_module_configs(model_config, module, config,
                                         ["text", "vision", "perceiver", "projector", "audio"])
    return module.Model(model_config)


def probe_forward(model: Any) -> Any:
    """The logits of the language model of `build`'s model on a few tokens, with its own
    cache, built and never evaluated (exod.runner.split.probe: does a split build?)."""
    from mlx_vlm.models.cache import make_prompt_cache

    lm = model.language_model
    tokens = mx.array([[1, 2, 3]], dtype=mx.int32)
    return lm(tokens, cache=make_prompt_cache(lm)).logits
