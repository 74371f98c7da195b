"""The sums `exoctl usage` prints: per key and instance, the requests, their tokens and their
time on the batch, over the records since a moment."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from exod.core.usage.record import UsageRecord


@dataclass
class Sums:
    key: str
    instance: str
    requests: int = 0
    failed: int = 0  # answered with a status of 400 or more (499: the client left)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    batch_seconds: float = 0.0

    def add(self, r: UsageRecord) -> None:
        self.requests += 1
        self.failed += r.status >= 400
        self.prompt_tokens += r.prompt_tokens
        self.cached_tokens += r.cached_tokens
        self.completion_tokens += r.completion_tokens
        self.batch_seconds += r.batch_seconds


def summarise(records: Iterable[UsageRecord], since: float | None = None,
              key: str | None = None) -> list[Sums]:
    """Sums by (key, instance), sorted by key then instance; `since`: epoch seconds (None:
    every record); `key`: that key's only."""
    sums: dict[tuple[str, str], Sums] = {}
    for r in records:
        if (since is not None and r.time < since) or (key is not None and r.key != key):
            continue
        sums.setdefault((r.key, r.instance), Sums(r.key, r.instance)).add(r)
    return [sums[k] for k in sorted(sums)]
