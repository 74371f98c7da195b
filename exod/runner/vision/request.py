"""A request inside the vision engine (exod.runner.vision.engine), from admitted to done, and
what a group's other ranks get of one rank 0 has seen."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx

from exod.wire import messages as m
from exod.runner.serving import tool_calls
from exod.runner.serving.output import Output
from exod.runner.serving.prepare import Checked, Processor
from exod.runner.vision.prompt import Seen


@dataclass
class Request:
    rid: str
    req: m.Generate
    seen: Seen
    checked: Checked
    processors: list[Processor]
    out: Output
    calls: tool_calls.Splitter | None
    features: dict[str, Any] | None = None  # get_input_embeddings', once seen, until released
    uid: int = -1  # in the generator, once released
    key: list[int] = field(default_factory=list)  # its prompt's cache key, once seen
    cached_tokens: int = 0
    completion_tokens: int = 0
    generated: list[int] = field(default_factory=list)
    prefilling: bool = True
    prefilled: int = 0
    # The distributions its tokens were drawn from, oldest first (logprobs asked only).
    rows: deque[mx.array] | None = None

    @property
    def prompt_tokens(self) -> int:
        return len(self.seen.tokens)


@dataclass(frozen=True)
class Shipped:
    """What a group's other ranks need of a request rank 0 has seen (exod.runner.group.plan.
    See): its tokens, its pictures' hashes, and its features (the embeddings' shape and dtype;
    the rest as they are)."""

    rid: str
    tokens: list[int]
    pictures: list[str]
    features: dict[str, Any]
    cached: int  # its prompt's tokens taken from rank 0's prompt cache
