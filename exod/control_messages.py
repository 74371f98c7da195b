"""Every request and answer on the control socket between exoctl and the daemon, defined once
for both ends, each checked field by field on arrival by exod.protocol's decoder.

The socket carries one JSON object per line rather than exod.protocol's length-prefixed frames:
exoctl(1) documents this protocol for people, who script it with `socat`/`nc -U` and read its
answers as they come; a binary length in front of each object would end that. The objects are
the same kind of typed messages all the same.

A request names its command under "cmd" (`{"cmd": "stop", "name": "big"}`). The final answer
is `{"ok": true, ...}` with the command's fields, or `Failure` (`{"ok": false, "error": ...}`);
the streaming commands (wait, watch, logs) send events first, named under "event". Imports
nothing heavy: exoctl starts in well under 0.3 s.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from exod.core.states import State
from exod.protocol import ProtocolError, decode_as, from_wire

REQUEST_TAG, EVENT_TAG = "cmd", "event"


# ---- requests -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class GetStatus:
    type: ClassVar[str] = "status"


@dataclass(frozen=True)
class Start:
    """Start NAME (also clears a failed state)."""

    type: ClassVar[str] = "start"
    name: str


@dataclass(frozen=True)
class Stop:
    type: ClassVar[str] = "stop"
    name: str


@dataclass(frozen=True)
class Restart:
    type: ClassVar[str] = "restart"
    name: str


@dataclass(frozen=True)
class Reload:
    type: ClassVar[str] = "reload"


@dataclass(frozen=True)
class Wait:
    """Progress events until NAME is ready (ok) or settles otherwise (not ok)."""

    type: ClassVar[str] = "wait"
    name: str


@dataclass(frozen=True)
class Watch:
    """A snapshot event at every change, until the client goes away."""

    type: ClassVar[str] = "watch"


@dataclass(frozen=True)
class Logs:
    """The last `lines` lines as line events, then (follow) each new one until the client
    goes away."""

    type: ClassVar[str] = "logs"
    name: str
    lines: int = 20
    rank: int | None = None
    follow: bool = False

    def __post_init__(self) -> None:
        if self.lines < 0:
            raise ProtocolError(f"lines must be a whole number >= 0, got {self.lines}")


@dataclass(frozen=True)
class Pull:
    """Fetch the hub model NAME (hf:ORG/NAME[@REVISION]) ahead of time: download events, then
    where it is."""

    type: ClassVar[str] = "pull"
    name: str


@dataclass(frozen=True)
class Models:
    """The hub models in exod's cache."""

    type: ClassVar[str] = "models"


@dataclass(frozen=True)
class RemoveModel:
    """Delete the hub model NAME from the cache (refused while an instance uses it)."""

    type: ClassVar[str] = "remove_model"
    name: str


@dataclass(frozen=True)
class ClearCache:
    """Empty the prompt cache of NAME (every instance without one), in RAM and on disk."""

    type: ClassVar[str] = "cache_clear"
    name: str | None = None


Request = (GetStatus | Start | Stop | Restart | Reload | Wait | Watch | Logs | Pull | Models
           | RemoveModel | ClearCache)
REQUESTS: dict[str, type[Any]] = {c.type: c for c in typing.get_args(Request)}
STREAMING = (Wait, Watch, Logs, Pull)  # they end when their client goes away


def decode_request(obj: dict[str, Any]) -> Request:
    msg: Request = from_wire(obj, REQUESTS, REQUEST_TAG)
    return msg


# ---- what status says ---------------------------------------------------------------------------
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
class Snapshot:
    daemon: DaemonStatus
    instances: list[InstanceStatus]


# ---- answers ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Failure:
    error: str
    problems: list[str] = field(default_factory=list)  # a reload's, one per line
    instance: InstanceStatus | None = None  # a wait's instance, as it settled
    ok: bool = False


@dataclass(frozen=True)
class StatusReply(Snapshot):
    ok: bool = True


@dataclass(frozen=True)
class StateReply:
    """After start, stop, restart: the instance's state."""

    state: State
    ok: bool = True


@dataclass(frozen=True)
class ReloadReply:
    added: list[str]
    removed: list[str]
    changed: list[str]
    unchanged: list[str]
    ok: bool = True


@dataclass(frozen=True)
class WaitReply:
    instance: InstanceStatus
    ok: bool = True


@dataclass(frozen=True)
class Done:
    """The end of a stream that has nothing more to say (logs)."""

    ok: bool = True


@dataclass(frozen=True)
class PullReply:
    path: str  # the snapshot in the cache
    commit: str
    ok: bool = True


@dataclass(frozen=True)
class ModelUser:
    name: str  # an instance naming the repository
    state: State
    revision: str


@dataclass(frozen=True)
class CachedModel:
    repo: str
    revisions: dict[str, str]  # ref (branch, tag) → commit
    commits: list[str]
    size_bytes: int
    partial_bytes: int  # of unfinished downloads
    instances: list[ModelUser]
    last_use: float | None = None  # epoch seconds: a request served, a start or a fetch


@dataclass(frozen=True)
class ModelsReply:
    cache: str
    models: list[CachedModel]
    ok: bool = True


@dataclass(frozen=True)
class RemovedReply:
    removed: str
    ok: bool = True


@dataclass(frozen=True)
class ClearedCache:
    name: str
    # "runner": its running rank 0 was asked (every rank clears its own, RAM and disk);
    # "files": it was not running, and its folder on this host was emptied.
    how: str
    freed_bytes: int  # the files removed here (0 when a runner does it)


@dataclass(frozen=True)
class ClearedReply:
    cleared: list[ClearedCache]
    ok: bool = True


Reply = (Failure | StatusReply | StateReply | ReloadReply | WaitReply | Done | PullReply
         | ModelsReply | RemovedReply | ClearedReply)


def decode_reply(obj: dict[str, Any], expect: type[Any]) -> Any:
    """The final answer to a request whose success is `expect`, or a Failure."""
    if obj.get("ok") is False:
        return decode_as(obj, Failure, "failure")
    if obj.get("ok") is not True:
        raise ProtocolError("an answer must say ok: true or false")
    return decode_as(obj, expect, expect.__name__)


# ---- events, before a stream's answer -----------------------------------------------------------
@dataclass(frozen=True)
class ProgressEvent:
    type: ClassVar[str] = "progress"
    instance: InstanceStatus


@dataclass(frozen=True)
class SnapshotEvent(Snapshot):
    type: ClassVar[str] = "snapshot"


@dataclass(frozen=True)
class LineEvent:
    """One line of a runner's output (exod.daemon.log_ring)."""

    type: ClassVar[str] = "line"
    time: float
    instance: str
    rank: int
    pid: int
    level: str
    text: str


@dataclass(frozen=True)
class DownloadEvent:
    """A pull's progress, e.g. `downloading 1.2GiB of 4.5GiB (27%, 38MiB/s)`, and its figures (a
    client draws its own bar from them): `phase` is `starting` (no size known yet),
    `downloading`, `verifying` (the hub's hashes) or `waiting` (a retry in backoff)."""

    type: ClassVar[str] = "download"
    detail: str
    phase: str = "starting"
    done_bytes: int = 0
    total_bytes: int = 0
    bytes_per_s: int | None = None


Event = ProgressEvent | SnapshotEvent | LineEvent | DownloadEvent
EVENT_TYPES = (ProgressEvent, SnapshotEvent, LineEvent, DownloadEvent)
EVENTS: dict[str, type[Any]] = {c.type: c for c in typing.get_args(Event)}
EXPECTS: dict[type[Any], type[Any]] = {  # each request's answer, when it succeeds
    GetStatus: StatusReply, Start: StateReply, Stop: StateReply, Restart: StateReply,
    Reload: ReloadReply, Wait: WaitReply, Watch: Done, Logs: Done, Pull: PullReply,
    Models: ModelsReply, RemoveModel: RemovedReply, ClearCache: ClearedReply}


def decode_line(obj: dict[str, Any], request: Request) -> Event | Reply:
    """One line of the answer to `request`: an event, or the final answer."""
    if EVENT_TAG in obj:
        event: Event = from_wire(obj, EVENTS, EVENT_TAG)
        return event
    reply: Reply = decode_reply(obj, EXPECTS[type(request)])
    return reply
