"""What `exoctl status` shows, typed: the daemon's snapshot of itself and of every instance,
rank, download and serving engine (made by exod.daemon.status; carried by the control socket's
answers and events, exod.wire.control)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from exod.core.nodes import Link, NodeInfo
from exod.core.states import State


@dataclass(frozen=True)
class ExitStatus:
    code: int | None
    signal: int | None
    text: str


@dataclass(frozen=True)
class LadderStatus:
    rung: str
    sigkill_in_s: float


@dataclass(frozen=True)
class RankStatus:
    rank: int
    host: str
    remote: bool
    pid: int | None
    state: State
    layers: list[int]  # [start, end)
    layers_loaded: int
    layers_total: int
    rss_bytes: int | None
    uptime_s: float | None
    last_exit: ExitStatus | None
    status: str
    phase: str | None
    error: str | None
    no_progress_s: float | None
    heartbeat_age_s: float | None
    ladder: LadderStatus | None


@dataclass(frozen=True)
class DiskCacheStatus:
    """The prompt cache's disk tier on rank 0 (each rank keeps its own layers' part)."""

    state: str  # ready, or what it waits for (hashing the weights), or why it is off
    entries: int
    bytes: int
    max_bytes: int
    hits: int  # lookups served from disk
    hit_rate: float | None  # hits per lookup; None before any
    cached_tokens: int
    load_s: float  # spent loading the entries that hit
    writes: int
    errors: int  # faults met, each a miss or a write not made (logged once per kind)


@dataclass(frozen=True)
class PromptCacheStatus:
    """The RAM tier's figures, and the disk tier's beside (a lookup is served by one tier at
    most: `hits` are RAM's, `disk.hits` disk's)."""

    entries: int
    bytes: int
    max_bytes: int
    lookups: int
    hits: int
    hit_rate: float | None  # hits per lookup; None before any
    cached_tokens: int
    prompt_tokens: int
    disk: DiskCacheStatus | None = None  # None: no disk tier
    # Prompts that started from a copy of another's in flight (a burst's shared prefix).
    shared_hits: int = 0
    shared_tokens: int = 0


@dataclass(frozen=True)
class SpeculativeStatus:
    """Speculative decoding (`draft_model`), counted since the runner started."""

    draft_tokens: int  # num_draft_tokens: proposed a step
    drafted: int  # draft tokens the model checked
    accepted: int  # of those, the ones it agreed with (each saves a step of the model)
    acceptance_rate: float | None  # accepted per drafted; None before any


@dataclass(frozen=True)
class BatchStatus:
    """An embedding model's or a reranker's forward passes, counted since the runner started."""

    batches: int
    inputs: int  # the inputs they held, from every request in flight
    mean_batch: float | None  # inputs per pass; None before any


@dataclass(frozen=True)
class ServingStatus:
    """How rank 0 serves: `batching` is "continuous", else why one request at a time."""

    batching: str
    width: int
    active: int
    prefill_step: int | None = None  # continuous batching only
    prompt_cache: PromptCacheStatus | None = None  # continuous batching only
    speculative: SpeculativeStatus | None = None  # with a draft_model only
    batches: BatchStatus | None = None  # an embedding model or a reranker only


@dataclass(frozen=True)
class DownloadStatus:
    """The download of a hub model an instance waits for (exod.daemon.downloads)."""

    repo: str
    revision: str
    pid: int | None
    done_bytes: int
    total_bytes: int
    bytes_per_s: int | None
    verifying: bool
    stalled: bool
    attempt: int
    error: str | None
    retry_in_s: float | None
    source: str | None = None  # the cluster peer the bytes come from (None: the hub)


@dataclass(frozen=True)
class InstanceStatus:
    name: str
    state: State
    detail: str
    reason: str | None
    since_s: float
    uptime_s: float | None
    model: str
    shards: int
    parallelism: str
    autostart: bool | Literal["on-demand"]
    restart: str
    restarts: int
    source: str
    serving: ServingStatus | None
    ranks: list[RankStatus]
    hub: str | None = None  # hf:ORG/NAME[@REVISION], for a model named by hub repository
    download: DownloadStatus | None = None  # while downloading


@dataclass(frozen=True)
class ApiStatus:
    listen: list[str]  # api.listen, as configured
    url: str  # the first address's, where exoctl chat goes
    urls: list[str]  # every address's (a port 0 resolved)
    auth: bool
    token_file: str | None


@dataclass(frozen=True)
class DaemonStatus:
    pid: int
    version: str
    uptime_s: float
    state: str
    config: str
    control_socket: str
    summary: str
    api: ApiStatus | None
    stop_worst_case_s: float


@dataclass(frozen=True)
class ClusterNode:
    """A row of the node table (exod.core.membership): a member, a stale one, or a refusal."""

    node_id: str  # "?" for a refusal whose record named none
    name: str
    state: str  # member, stale, foreign
    last_heard_s: float  # seconds ago
    address: str  # where it was last heard from
    info: NodeInfo | None = None  # what it announced (members and stale ones)
    reason: str | None = None  # why it was refused (foreign ones)
    refusals: int = 0  # how many times (foreign ones)


@dataclass(frozen=True)
class ClusterStatus:
    """Discovery, as this node sees it (exod.daemon.cluster)."""

    cluster_id: str  # named by a hash of the key, never the key
    listen: str  # where the endpoint listens (a port 0 resolved)
    mdns: bool
    peers: list[str]
    announced: NodeInfo  # what this node announces of itself
    nodes: list[ClusterNode]
    links: list[Link]
    error: str | None = None  # mDNS could not start, say: discovery then runs on peers alone


@dataclass(frozen=True)
class Snapshot:
    daemon: DaemonStatus
    instances: list[InstanceStatus]
    cluster: ClusterStatus | None = None  # None: no cluster.key_file, or announce false
