"""mlx-lm's BatchGenerator, speculating: the same generator (its queue, its prompt batches read
in chunks, its insert, remove and extract), made on the model and its draft as one
(exod.runner.serving.speculative.pair), whose rows, once read, go on to a SpeculativeBatch
instead of mlx-lm's GenerationBatch. What it replaces are two of the generator's own fields,
where mlx-lm 0.32 keeps its batches; `why_not` says when that or a model's caches do not fit.
"""

from __future__ import annotations

from typing import Any, cast

from mlx_lm.generate import BatchGenerator, PromptProcessingBatch
from mlx_lm.models.cache import KVCache, make_prompt_cache

from exod.runner.serving.gen_options import Draft
from exod.runner.serving.speculative.batch import SpeculativeBatch
from exod.runner.serving.speculative.pair import Drafted

__all__ = ["SpeculativeGenerator", "why_not"]


class _ReadingBatch(PromptProcessingBatch):
    """mlx-lm's prompt batch; its rows, read, become a SpeculativeBatch."""

    def generate(self, tokens: list[list[int]]) -> SpeculativeBatch:
        if any(len(t) > 1 for t in tokens):
            self.prompt([t[:-1] for t in tokens])
        batch = SpeculativeBatch.start(
            cast(Drafted, self.model), self.uids, [t[-1] for t in tokens], self.prompt_cache,
            self.tokens, self.samplers, self.logits_processors, self.stop_sequences,
            self.max_tokens)
        self.uids, self.prompt_cache, self.tokens = [], [], []
        self.samplers, self.logits_processors, self.stop_sequences, self.max_tokens = \
            [], [], [], []
        return batch


class SpeculativeGenerator(BatchGenerator):
    def __init__(self, model: Any, draft: Draft, **kwargs: Any) -> None:
        pair = Drafted(model, draft)
        super().__init__(cast(Any, pair), **kwargs)  # the model's part in it, and no more
        if not isinstance(getattr(self, "_prompt_batch", None), PromptProcessingBatch):
            raise RuntimeError("mlx-lm's BatchGenerator keeps its batches elsewhere than 0.32")
        self._prompt_batch = _ReadingBatch.empty(cast(Any, pair), self.sampler,
                                                 prefill_step_size=self.prefill_step_size)
        self._generation_batch = SpeculativeBatch(pair)


def why_not(model: Any, draft: Draft) -> str | None:
    """Why this model and draft cannot speculate in the batch (then by turns), or None."""
    for name, m in (("the model", model), ("the draft model", draft.model)):
        kinds = sorted({type(c).__name__ for c in make_prompt_cache(m) if type(c) is not KVCache})
        if kinds:
            return (f"speculative decoding in the batch rewinds rows of plain KV caches, and "
                    f"{name} has {', '.join(kinds)}")
    return None
