"""The vision engine's prompt cache.

Prompt cache, as for text (exod.runner.serving.batch_engine): when a request ends, the KV cache
of its prompt and answer is stored under their key (exod.runner.serving.cache_key: the tokens,
each picture's placeholders standing for that picture); a later request whose key shares a
prefix with a stored one (the next turn about the same picture) prefills only the rest. Its
pictures' embeddings are still merged (the tower's output from the feature cache), since the
rest may hold some of them. Such a prompt prefills in a batch of its own, so a short hit that
holds none of its pictures (the chat template's opening, shared by a burst of new pictures) is
not taken while other prompts wait (`_lookup`).

A mixin of `exod.runner.vision.engine.VisionEngine`, kept apart so each module stays one job.
"""

from __future__ import annotations

from typing import Any

from mlx_lm.models.cache import LRUPromptCache, can_trim_prompt_cache, trim_prompt_cache

from exod.runner.prompt_cache import snapshot
from exod.runner.vision.generator import Generator
from exod.runner.vision.request import Request

CACHE_KEY = "model"  # LRUPromptCache keys entries by model too; a runner serves one
# Where a family's config names the token that stands for a picture's part in the prompt.
PLACEHOLDER_KEYS = ("image_token_id", "image_token_index", "video_token_id",
                    "video_token_index")


class KeptPrompts:
    _cache: LRUPromptCache
    _gen: Generator
    _ended: dict[int, Request]
    cache_bytes: int
    cache_lookups: int
    cache_hits: int
    cached_tokens: int
    placeholders: frozenset[int]

    def _lookup(self, key: list[int], crowded: bool,
                tokens: list[int]) -> tuple[list[Any] | None, int]:
        """The stored KV cache nearest to a prompt's key, and how many of its tokens it holds.
        `crowded`: other prompts are to be prefilled beside it, so a short hit is declined
        (rank 0 only: another rank takes what rank 0 took)."""
        self.cache_lookups += 1
        if not self.cache_bytes:
            return None, 0
        cache, rest = self._cache.fetch_nearest_cache(CACHE_KEY, key)
        if cache is None:
            return None, 0
        hit = len(key) - len(rest)
        if crowded and hit < len(rest) and hit <= _first_picture(tokens, self.placeholders):
            # A hit on less than half the prompt that holds none of its pictures (text shared
            # with another conversation: the chat template's opening, in a burst of new
            # pictures) while other prompts wait to be seen or prefilled: a warm prompt
            # prefills in a batch of its own (exod.runner.vision.generator), so taking it
            # would cost the batch more steps than it saves. An earlier turn of the same
            # conversation holds its pictures: always taken.
            return None, 0
        if not rest:  # an exact hit: the last token must still run, for its logits
            if not can_trim_prompt_cache(cache):
                return None, 0
            trim_prompt_cache(cache, 1)
            rest = key[-1:]
        cached = len(key) - len(rest)
        self.cache_hits += 1
        self.cached_tokens += cached
        return cache, cached

    def _store_kept(self) -> None:
        """The caches of the requests that left the batch, under their keys."""
        for uid, cache in self._gen.kept.items():
            r = self._ended.pop(uid, None)
            if r is not None and cache:
                snapshot.prepare(cache)  # its own arrays: a view would hold the whole batch's
                self._cache.insert_cache(CACHE_KEY, r.key + r.generated, cache)
        self._gen.kept.clear()
        self._ended.clear()

    def follow_cache(self) -> None:
        """Evict nothing by bytes: rank 0's entry count says what to keep (as the text
        engine's, exod.runner.serving.batch_engine)."""
        self._cache.max_bytes = 1 << 62

    @property
    def cache_entries(self) -> int:
        return len(self._cache)

    def trim_cache(self, entries: int) -> None:
        self._cache.trim_to(n_sequences=entries)

    def clear_cache(self) -> None:
        """`exoctl cache clear`: every entry (a group's ranks replay it: exod.runner.group.
        lockstep)."""
        self._cache.trim_to(n_sequences=0)


def _first_picture(tokens: list[int], placeholders: frozenset[int]) -> int:
    """Where a prompt's first picture starts (its length when it shows none)."""
    return next((i for i, t in enumerate(tokens) if t in placeholders), len(tokens))


def placeholders(config: Any) -> frozenset[int]:
    """The ids that stand for pictures' parts in a prompt of this model (its config's)."""
    found = {getattr(config, k, None) for k in PLACEHOLDER_KEYS}
    return frozenset(x for x in found if isinstance(x, int) and not isinstance(x, bool))
