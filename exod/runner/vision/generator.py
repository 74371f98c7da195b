"""mlx-vlm's `BatchGenerator`, with the two things exod's prompt cache needs of it and it lacks
(docs/design/vision.md): a request can start from a stored KV cache, and a request that leaves
the batch leaves its KV cache behind.

- `insert_warm`: a request whose prompt's first tokens are cached is prefilled from that cache,
  its other tokens only, in a prompt batch of its own (mlx-vlm's `PromptProcessingBatch`, given
  the cache as its `warm_cache`, as its own prefix cache does), one chunk per `next()` beside
  the generator's own work, then joins the decoding batch.
- `kept`: when a row leaves the decoding batch (it ended, or was removed) and `keeps(uid)`
  says its cache is wanted, the row's cache is extracted first (prompt and every token it
  generated), under its uid, for the engine to store.

Uses mlx-vlm 0.7's internals (`_generation_batch`, `_extend_generation_batch`), which the
pinned range of the extra holds; the engine's tests fail if they move.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx
from mlx_vlm.generate import BatchGenerator
from mlx_vlm.generate.ar import GenerationBatch, PromptProcessingBatch


class Generator(BatchGenerator):
    def __init__(self, *args: Any, keeps: Callable[[int], bool], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.keeps = keeps
        self.kept: dict[int, list[Any]] = {}
        self._warm: dict[int, Any] = {}  # uid -> its PromptProcessingBatch, oldest first
        _keeping(self._generation_batch, self)

    @property
    def warm(self) -> int:
        return len(self._warm)

    def insert_warm(self, tokens: list[int], cached: int, cache: list[Any], max_tokens: int,
                    features: dict[str, Any], processors: list[Any]) -> int:
        """Queue a request whose first `cached` tokens are in `cache` (one entry per layer, as
        mlx-vlm's caches extract a row): `features` are its whole prompt's (get_input_
        embeddings'), of which only the rest is prefilled."""
        uid = self.uid_count
        self.uid_count += 1
        batch = PromptProcessingBatch(
            model=self.model, uids=[uid], input_ids=[tokens[cached:]], max_tokens=[max_tokens],
            inputs_embeds=features["inputs_embeds"][:, cached:],
            prompt_kwargs=_from(features, cached, len(tokens)),
            logits_processors=[processors], prefill_step_size=self.prefill_step_size,
            warm_cache=[type(c).merge([c]) for c in cache],
            greedy_sampling=self.greedy_sampling)
        if processors:  # penalties look back on the whole prompt, as without a cache
            batch._token_context = [list(tokens)]
        self._warm[uid] = batch
        return uid

    def next(self, **kwargs: Any) -> Any:
        if self._warm:
            with mx.stream(self._stream):
                uid, batch = next(iter(self._warm.items()))
                if batch.needs_processing():
                    batch.prompt_step()
                else:
                    del self._warm[uid]
                    self._extend_generation_batch(batch.generate(
                        self.sampler, self.tokenizer.stopping_criteria,
                        compute_logprobs=self.compute_logprobs,
                        top_logprobs_k=self.top_logprobs_k))
        return super().next(**kwargs)

    def remove(self, uid: int) -> bool:
        if self._warm.pop(uid, None) is not None:
            return True
        return bool(super().remove(uid))

    def _extend_generation_batch(self, gen_batch: Any) -> None:
        super()._extend_generation_batch(gen_batch)
        _keeping(self._generation_batch, self)


def _from(features: dict[str, Any], start: int, length: int) -> dict[str, Any]:
    """The features of a prompt's tokens from `start` on: the arrays along the prompt (M-RoPE's
    position_ids: [3, 1, length]) cut there, the others (rope_deltas) as they are."""
    out = {}
    for k, v in features.items():
        if k == "inputs_embeds":
            continue
        if isinstance(v, mx.array) and v.ndim >= 2 and v.shape[-1] == length:
            v = v[..., start:]
        out[k] = v
    return out


class _Keeping(GenerationBatch):
    """A decoding batch that hands the cache of each row it drops to its generator first."""

    owner: Generator

    def filter(self, keep: list[int]) -> None:
        kept = set(keep)
        for i, uid in enumerate(self.uids):
            if i not in kept and self.owner.keeps(uid) and self.prompt_cache:
                # A batch of one prefilled alone has the plain caches (one row: this one).
                self.owner.kept[uid] = [c.extract(i) if hasattr(c, "extract") else c
                                        for c in self.prompt_cache]
        super().filter(keep)


def _keeping(batch: Any, owner: Generator) -> None:
    if type(batch) is GenerationBatch:
        batch.__class__ = _Keeping
    if isinstance(batch, _Keeping):
        batch.owner = owner
