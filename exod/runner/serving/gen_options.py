"""mlx-lm's generation options of an instance, on the runner's side: the KV cache a generation
gets (float, quantized past a number of tokens, or rotating) and the draft model of speculative
decoding. Each says up front, at load, why a model cannot take it (a ModelError then, before
READY), so an option is never accepted and silently ignored by mlx-lm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlx_lm.generate import maybe_quantize_kv_cache
from mlx_lm.models.cache import (KVCache, RotatingKVCache, can_trim_prompt_cache,
                                  make_prompt_cache)

from exod.core.serving import DEFAULT_KV_GROUP_SIZE, DEFAULT_QUANTIZED_KV_START

KEEP = 4  # tokens a rotating cache never overwrites (mlx-lm's make_prompt_cache keeps 4)


@dataclass(frozen=True)
class KvOptions:
    bits: int | None = None  # None: a float cache
    group_size: int = DEFAULT_KV_GROUP_SIZE
    start: int = DEFAULT_QUANTIZED_KV_START  # tokens held before the cache is quantized
    max_size: int | None = None  # a rotating cache of this many tokens

    def make(self, model: Any) -> list[Any]:
        """A generation's cache. mlx-lm's make_prompt_cache ignores max_kv_size for the many
        families that make their own caches (llama among them): there each plain KVCache
        becomes the rotating cache mlx-lm would have made, and a family's own rotating
        (sliding-window) or state caches stay as they are."""
        if self.max_size is None or not hasattr(model, "make_cache"):
            return make_prompt_cache(model, self.max_size)
        return [RotatingKVCache(max_size=self.max_size, keep=KEEP) if type(c) is KVCache else c
                for c in make_prompt_cache(model)]

    def for_batch(self, model: Any, cache: list[Any] | None) -> list[Any] | None:
        """The cache a request joins the batch with: `cache` (a prompt cache entry) or a new
        one; None lets BatchGenerator make its own. Quantized, it is made mergeable into a
        quantized batch (exod.runner.serving.quantized_batch)."""
        if self.bits is not None:
            from exod.runner.serving.quantized_batch import Quant, rows

            return rows(cache if cache is not None else self.make(model),
                        Quant(self.bits, self.group_size, self.start))
        if cache is None and self.max_size is not None:
            return self.make(model)  # BatchGenerator's own would not rotate (llama)
        return cache

    def after_chunk(self, cache: list[Any]) -> None:
        """What mlx-lm's generate_step does after each prefill chunk: quantize the cache in
        place once it holds `start` tokens."""
        maybe_quantize_kv_cache(cache, self.start, self.group_size, self.bits)

    def generate_kwargs(self) -> dict[str, Any]:
        """generate_step's and speculative_generate_step's own arguments for the cache."""
        if self.bits is None:
            return {}
        return {"kv_bits": self.bits, "kv_group_size": self.group_size,
                "quantized_kv_start": self.start}

    def problem(self, model: Any) -> str | None:
        """Why `model` cannot take these options, or None."""
        if self.max_size is not None:
            kinds = {type(c).__name__ for c in make_prompt_cache(model)}
            if "KVCache" not in kinds and hasattr(model, "make_cache"):
                return (f"max_kv_size: this model's caches ({', '.join(sorted(kinds))}) hold no "
                        "plain KV cache for a rotating one to replace; remove max_kv_size")
        if self.bits is not None:
            odd = sorted({type(c).__name__ for c in self.make(model)
                          if not isinstance(c, KVCache)})
            if odd:
                return (f"kv_bits: mlx-lm quantizes only plain KV caches, and this model uses "
                        f"{', '.join(odd)}; remove kv_bits")
        return None


@dataclass
class Draft:
    """Speculative decoding: the draft model and how many tokens it drafts a step."""

    model: Any
    tokens: int
    drafted: int = 0  # draft tokens checked by the model, since the runner started
    accepted: int = 0

    def problem(self, model: Any, vocab: int | None, draft_vocab: int | None) -> str | None:
        if vocab is not None and draft_vocab is not None and vocab != draft_vocab:
            return (f"draft_model: its vocabulary ({draft_vocab} tokens) is not the model's "
                    f"({vocab}); a draft model must share the model's tokenizer")
        for name, m in (("the model", model), ("the draft model", self.model)):
            if not can_trim_prompt_cache(make_prompt_cache(m)):
                kinds = sorted({type(c).__name__ for c in make_prompt_cache(m)
                                if not c.is_trimmable()})
                return (f"draft_model: speculative decoding rewinds the caches after a "
                        f"rejected draft, and {name}'s ({', '.join(kinds)}) cannot be rewound")
        return None

    def describe(self) -> str:
        if not self.drafted:
            return f"{self.tokens} draft tokens a step"
        return (f"{self.accepted} of {self.drafted} drafted tokens accepted "
                f"({100 * self.accepted / self.drafted:.0f}%)")
