"""The plan rank 0 of a group sends the other ranks before each step (exod.runner.group.lockstep):
the engine operations since the last step, in order, the prompt cache's entry count, and
whether to step. Pure (no mlx): each operation is a typed message, and the plan is one of the
group's commands (exod.runner.group.wire), checked field by field by exod.wire.protocol's decoder
when it arrives.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from exod.wire import messages as m
from exod.wire.protocol import ProtocolError


# ---- operations, replayed in order on every other rank's engine --------------------------------
@dataclass(frozen=True)
class Admit:
    """A request rank 0 admitted (with the seed rank 0 drew for it, when it had none), and the
    disk entry its prompt starts from (its key, and the prompt tokens it covers), if any: every
    rank loads its own part of that entry, and if one cannot, none uses it."""

    type: ClassVar[str] = "admit"
    request: m.Generate
    disk_key: str | None = None
    disk_tokens: int = 0

    def __post_init__(self) -> None:
        if self.disk_tokens < 0 or (self.disk_key is None) != (self.disk_tokens == 0):
            raise ProtocolError("admit: disk_key and disk_tokens go together")


@dataclass(frozen=True)
class CancelOp:
    type: ClassVar[str] = "cancel"
    id: str


@dataclass(frozen=True)
class AbortPrefilling:
    """End the prompts still being prefilled (a stop began)."""

    type: ClassVar[str] = "abort_prefilling"


@dataclass(frozen=True)
class AbortAll:
    """End every request (the drain is over)."""

    type: ClassVar[str] = "abort_all"


@dataclass(frozen=True)
class Ints:
    """An integer array, by shape and values in order (a feature of a prompt: positions)."""

    shape: list[int]
    values: list[int]
    dtype: Literal["int32", "int64", "uint32"] = "int32"

    def __post_init__(self) -> None:
        n = 1
        for d in self.shape:
            n *= d
        if any(d < 0 for d in self.shape) or n != len(self.values):
            raise ProtocolError(f"plan: an array of shape {self.shape} with "
                                f"{len(self.values)} values")


@dataclass(frozen=True)
class See:
    """A request of a model that sees, as rank 0 saw it (its pictures through the tower, which
    runs on rank 0 only): the other ranks take its prompt's tokens, the embeddings' width and
    dtype (their values come from the previous rank), and the features the language model
    reads beside them (M-RoPE's positions), never its pictures. `pictures`: their SHA-256s,
    for the prompt cache's key (exod.runner.serving.cache_key). `request`: without its
    pictures, for its sampling, stops and grammar."""

    type: ClassVar[str] = "see"
    request: m.Generate
    tokens: list[int]
    pictures: list[str]
    width: int
    dtype: str
    features: dict[str, Ints] = field(default_factory=dict)
    cached: int = 0  # tokens rank 0 took from its prompt cache (none: the others take none)


@dataclass(frozen=True)
class Warm:
    """Prefill these tokens into the prompt cache (a `warm:` prompt rank 0 does not hold)."""

    type: ClassVar[str] = "warm"
    tokens: list[int]


@dataclass(frozen=True)
class ClearCacheOp:
    """`exoctl cache clear`: every rank forgets its prompt cache, in RAM and on its disk."""

    type: ClassVar[str] = "clear_cache"


Op = Admit | See | CancelOp | AbortPrefilling | AbortAll | Warm | ClearCacheOp


@dataclass(frozen=True)
class Settings:
    """Rank 0's engine settings: every rank's engine must be the same (a host's own config
    could say otherwise)."""

    width: int
    cache_bytes: int
    prefill_step: int

    def __post_init__(self) -> None:
        if self.width < 1 or self.cache_bytes < 0 or self.prefill_step < 0:
            raise ProtocolError(f"plan: impossible engine settings {self}")


@dataclass
class Plan:
    """Built up by rank 0 between two steps (so not frozen), sent, then replaced."""

    type: ClassVar[str] = "plan"
    ops: list[Op] = field(default_factory=list)
    keep: int = 0  # prompt cache entries after the last step
    step: bool = False
    settings: Settings | None = None  # in the first plan only

    def __post_init__(self) -> None:
        if self.keep < 0:
            raise ProtocolError(f"plan: keep {self.keep} is negative")
