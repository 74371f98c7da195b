"""A request in the batch engine (exod.runner.serving.batch_engine): what it asked, where it is
(waiting to start or held back, loading its prompt's cache from disk, prefilling, decoding),
and what it has produced so far."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mlx_lm.sample_utils import greedy_sampler

from exod.runner.prompt_cache.tiers import FromDisk
from exod.runner.serving import tool_calls
from exod.runner.serving.grammar import Constraint
from exod.runner.serving.holding import HeldBack
from exod.runner.serving.output import Output
from exod.runner.serving.sampling import Sampler


@dataclass
class BatchRequest:
    rid: str
    prompt: list[int]
    out: Output | None  # None: a warm-up, whose output nobody reads
    calls: tool_calls.Splitter | None = None
    top_logprobs: int | None = None  # None: no logprobs asked
    insert: dict[str, Any] = field(default_factory=dict)  # BatchGenerator.insert's arguments
    uid: int = -1  # -1 while its disk entry loads (not in the batch yet)
    load: FromDisk | None = None
    sampler: Sampler = greedy_sampler  # its own, run by the batch's (BatchSampler)
    grammar: Constraint | None = None  # its mask, added by the batch's sampler
    cached_tokens: int = 0
    completion_tokens: int = 0
    prefilling: bool = True
    prefilled: int = 0  # prompt tokens through the model so far (as reported, approximately)
    in_cache: int = 0  # tokens its cache holds, as of the last step (shared_prefix reads it)
    base: int = 0  # tokens its cache held when it went into the batch
    limit: int = 0  # the most tokens it may generate
    # Not started yet, or held back (exod.runner.serving.fair_share): `held` brings it back;
    # `disk` is how it looks its prompt up once it starts (batch_engine.DiskChoice, or OWN).
    waiting: bool = False
    held: HeldBack | None = None
    disk: Any = None

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt)
