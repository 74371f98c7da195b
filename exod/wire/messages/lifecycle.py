"""What a runner (and a fetcher) says of itself on its channel: hello, its phase, progress,
ready or failed, heartbeats, its serving figures; a fetcher's download and what it fetched."""

from __future__ import annotations

import dataclasses
import enum
import functools
from dataclasses import dataclass
from typing import ClassVar

from exod.wire.protocol import ProtocolError


class Phase(str, enum.Enum):
    """What a runner is doing, for status and for the daemon's decisions (never a parsed text)."""

    STARTING = "starting"  # the process is up, importing mlx
    CONNECTING = "connecting"  # joining its group (a peer host may be down for hours)
    WAITING = "waiting"  # loaded; waiting for the other ranks of its group to load
    LOADING = "loading"
    READY = "ready"
    SERVING = "serving"  # at least one generation in flight
    STOPPING = "stopping"
    FAILED = "failed"


# ---- runner → daemon: lifecycle --------------------------------------------------------------
@dataclass(frozen=True)
class Hello:
    type: ClassVar[str] = "hello"
    version: int
    pid: int


@dataclass(frozen=True)
class Status:
    """`text` is for people (`exoctl status`); decisions use `phase` and the numbers."""

    type: ClassVar[str] = "status"
    phase: Phase
    text: str = ""
    attempt: int = 0  # CONNECTING: which attempt at forming the group
    active: int = 0  # SERVING: generations in flight


@dataclass(frozen=True)
class LoadProgress:
    """Layer `loaded` of `total` is in memory (0 of N: loading has begun)."""

    type: ClassVar[str] = "progress"
    loaded: int
    total: int

    def __post_init__(self) -> None:
        if not 0 <= self.loaded <= self.total:
            raise ProtocolError(f"progress: {self.loaded} of {self.total} layers is impossible")


@dataclass(frozen=True)
class Ready:
    """Loaded (and, for a group, past the group-wide barrier): requests may come."""

    type: ClassVar[str] = "ready"
    vocab_size: int = 0  # 0: unknown
    context_length: int = 0

    def __post_init__(self) -> None:
        # The API's limits come from these: a negative one would let every request through.
        if self.vocab_size < 0 or self.context_length < 0:
            raise ProtocolError("ready: a negative vocab_size or context_length")


@dataclass(frozen=True)
class Failed:
    """Why the runner is about to exit with `exit_code` (the reason status shows)."""

    type: ClassVar[str] = "failed"
    reason: str
    exit_code: int


@dataclass(frozen=True)
class Heartbeat:
    """Sent from the runner's main loop while it serves: a stuck loop stops sending."""

    type: ClassVar[str] = "heartbeat"


HEARTBEAT_EVERY = 5.0  # seconds between a serving runner's heartbeats (status shows their age)


@dataclass(frozen=True)
class Stopping:
    type: ClassVar[str] = "stopping"
    reason: str = ""


@dataclass(frozen=True)
class ServingReport:
    """How rank 0 serves: `batching` is "continuous" (exod.runner.serving.batch_engine, on every
    rank of a group), else the reason it runs one request at a time. The cache figures count since
    the runner started: `cache_*` and `cached_tokens` are the RAM tier's, `disk_*` the disk
    tier's (exod.runner.prompt_cache); a lookup is served by one tier at most."""

    type: ClassVar[str] = "serving"
    batching: str
    width: int  # max_concurrency
    active: int
    prefill_step: int = 0  # prompt tokens per step at most, over all prompts
    cache_max_bytes: int = 0  # prompt_cache_bytes; 0: no prompt cache
    cache_entries: int = 0
    cache_bytes: int = 0
    cache_lookups: int = 0
    cache_hits: int = 0  # lookups that found a stored prefix
    cached_tokens: int = 0  # prompt tokens taken from the cache instead of prefilled
    prompt_tokens: int = 0  # prompt tokens of every lookup
    draft_tokens: int = 0  # speculative decoding: tokens drafted a step (0: no draft model)
    drafted: int = 0  # draft tokens the model checked
    draft_accepted: int = 0  # of those, the ones the model agreed with
    # An embedding or reranker model (exod.runner.embed): forward passes, and the inputs they
    # held (their mean: the batch size), over all requests.
    batches: int = 0
    batched_inputs: int = 0
    disk_max_bytes: int = 0  # prompt_cache_disk_bytes; 0: no disk tier
    disk_entries: int = 0
    disk_bytes: int = 0
    disk_hits: int = 0  # lookups served from disk (loaded instead of prefilled)
    disk_cached_tokens: int = 0
    disk_load_ms: int = 0  # spent loading the entries that hit
    disk_writes: int = 0
    disk_errors: int = 0  # faults met (each a miss, or a write not made), each logged once
    disk_state: str = ""  # ready, or what it waits for, or why it is off
    # Prompts started from a copy of another's prefix still in flight (no tier held it yet).
    shared_hits: int = 0
    shared_tokens: int = 0
    # The engine shares its batch between keys (exod.runner.serving.fair_share): it takes
    # requests beyond its width and chooses whom to start, so the daemon sends it the queue.
    fair: bool = False

    def __post_init__(self) -> None:
        # Every status snapshot carries these: a runaway text or an impossible count is a
        # broken runner, not something to show.
        if len(self.batching) > 500 or len(self.disk_state) > 500:
            raise ProtocolError("serving: batching or disk_state is longer than 500 characters")
        # The serve loop makes one after every step: its field names are looked up once.
        for name in _counts():
            value = getattr(self, name)
            if isinstance(value, int) and value < 0:
                raise ProtocolError(f"serving: {name} is negative")


@functools.cache
def _counts() -> tuple[str, ...]:
    """ServingReport's fields but its two texts: its counts."""
    return tuple(f.name for f in dataclasses.fields(ServingReport)
                 if f.name not in ("batching", "disk_state"))


# ---- fetcher → daemon (`python -m exod.hub`, on the same kind of channel) -------------------
@dataclass(frozen=True)
class DownloadProgress:
    """`done` of `total` bytes of a model's files are on disk (`verifying`: hashed)."""

    type: ClassVar[str] = "download"
    done: int
    total: int
    verifying: bool = False
    source: str = ""  # where the bytes come from: a cluster peer's name ("": the hub)

    def __post_init__(self) -> None:
        if not 0 <= self.done <= self.total:
            raise ProtocolError(f"download: {self.done} of {self.total} bytes is impossible")


@dataclass(frozen=True)
class Fetched:
    """Every file is in the cache and matches the hub's hashes: the snapshot at `path`."""

    type: ClassVar[str] = "fetched"
    path: str
    commit: str
