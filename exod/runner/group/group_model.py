"""Running one model across the ranks of a group: pipeline (each rank owns a layer range) or
tensor parallel (every rank owns a slice of every layer).

Every rank runs the same serving engine on the same request stream (exod.runner.group.lockstep), so
every rank calls the model the same number of times with the same shapes. `GroupModel` is what
each rank hands to that engine: the model's own forward (the hidden state travels rank 0 → 1 →
… → N-1 inside it for a pipeline, see exod.runner.split.pipeline; a tensor rank's sharded layers
all_sum inside it), then the last position's logits go from the rank that has them to every
rank, so every rank samples the same token.

Each forward is evaluated at once, on every rank, in the same order, watched by the group's
deadline (a lost peer is PeerLost, never a hang): mlx-lm evaluates lazily and sometimes only
part of a graph (a prefill chunk evaluates the KV cache alone), and a send that nobody
evaluates would leave its peer waiting. A non-last pipeline rank never evaluates its own logits,
so the weights only the last rank uses (final norm, lm_head) are never read there.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx import nn

from exod.runner.load import Loaded
from exod.runner.group.membership import Group


class GroupModel:
    """The model as the engine sees it on one rank of a group: logits on every rank."""

    def __init__(self, loaded: Loaded, group: Group) -> None:
        self.model = loaded.model
        self.link = loaded.link
        self.group = group
        self.pipeline = loaded.parallelism == "pipeline" and loaded.link is not None
        # The rank whose logits every rank uses: the last of a pipeline (the only one that
        # has them); rank 0 for tensor parallelism (every rank has them; rank 0's copy makes
        # sure every rank samples from exactly the same numbers, however all_sum rounds).
        self.source = group.size - 1 if self.pipeline else 0

    def __getattr__(self, name: str) -> Any:
        # layers, make_cache, args...: what mlx-lm's cache and generation code read
        return getattr(self.__dict__["model"], name)

    def __call__(self, inputs: mx.array, cache: Any = None, **kwargs: Any) -> mx.array:
        g = self.group
        positions = int(inputs.size)
        out = self.model(inputs, cache=cache, **kwargs)
        # mlx-vlm's language models give an object with the logits (mlx-lm's, the logits).
        logits = getattr(out, "logits", out)[:, -1:, :]
        if not self.pipeline:
            g.compute(logits, positions)  # every rank's all_sums are in its own forward
        elif g.rank != self.source and self.link is not None:
            g.compute(self.link.take_pending(), positions)  # its layers and its send
        else:
            g.compute(logits, positions)  # the last rank: its receive, layers and logits
        mine = logits if g.rank == self.source else mx.zeros(logits.shape, logits.dtype)
        # Adding zeros is exact: every rank gets the source's logits bit for bit.
        return g.all_sum(mine, positions)


def warm_up(loaded: Loaded, group: Group | None) -> None:
    """One token through the model (and every rank of its group), with a fresh cache."""
    tok = loaded.tokenizer
    first = next((t for t in (getattr(tok, "bos_token_id", None),
                              getattr(tok, "eos_token_id", None)) if isinstance(t, int)), 0)
    tokens = mx.array([[first]])
    if group is None:
        mx.eval(loaded.model(tokens, cache=new_cache(loaded.model)))
        return
    GroupModel(loaded, group)(tokens, cache=new_cache(loaded.model))


def new_cache(model: nn.Module) -> list[Any]:
    """A cache per block, stand-ins included (they keep positions, not keys and values)."""
    from mlx_lm.models.cache import make_prompt_cache

    return list(make_prompt_cache(model))
