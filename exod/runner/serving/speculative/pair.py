"""The model and its draft as one model for mlx-lm's BatchGenerator while it reads prompts: a
forward runs both on the same tokens, each on its own caches (the model's layers first, then
the draft's, the order of mlx-lm's speculative_generate_step), and returns the model's logits.

So mlx-lm's prompt batches prefill the draft beside the model in the same chunks, and merge,
filter, extend and extract its caches with the model's; the prompt cache stores and loads the
two as one entry (exod.runner.serving.speculative, "why the draft's cache is stored")."""

from __future__ import annotations

from typing import Any

from mlx_lm.models.cache import make_prompt_cache

from exod.runner.serving.gen_options import Draft


class Drafted:
    def __init__(self, model: Any, draft: Draft) -> None:
        self.model = model
        self.draft = draft  # its model, tokens drafted a step, and the counts of the instance
        self.split = len(make_prompt_cache(model))  # the model's caches, before the draft's

    def make_cache(self) -> list[Any]:
        return make_prompt_cache(self.model) + make_prompt_cache(self.draft.model)

    def parts(self, cache: list[Any]) -> tuple[list[Any], list[Any]]:
        """(the model's caches, the draft's)."""
        return cache[:self.split], cache[self.split:]

    def __call__(self, inputs: Any, cache: list[Any] | None = None, **kw: Any) -> Any:
        ours, theirs = self.parts(cache if cache is not None else self.make_cache())
        self.draft.model(inputs, cache=theirs, **kw)  # its logits are never evaluated
        return self.model(inputs, cache=ours, **kw)
