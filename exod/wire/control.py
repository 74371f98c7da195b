"""Every request and answer on the control socket between exoctl and the daemon, defined once
for both ends, each checked field by field on arrival by exod.wire.protocol's decoder.

The socket carries one JSON object per line rather than exod.wire.protocol's length-prefixed frames:
exoctl(1) documents this protocol for people, who script it with `socat`/`nc -U` and read its
answers as they come; a binary length in front of each object would end that. The objects are
the same kind of typed messages all the same.

A request names its command under "cmd" (`{"cmd": "stop", "name": "big"}`). The final answer
is `{"ok": true, ...}` with the command's fields, or `Failure` (`{"ok": false, "error": ...}`);
the streaming commands (wait, watch, logs) send events first, named under "event". The
snapshot that status answers and events carry is exod.wire.control_status. Imports nothing heavy:
exoctl starts in well under 0.3 s.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

from exod.wire.control_status import InstanceStatus, Snapshot
from exod.core.states import State
from exod.wire.protocol import ProtocolError, decode_as, from_wire

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
class RestartRequest:
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
class ClearCacheRequest:
    """Empty the prompt cache of NAME (every instance without one), in RAM and on disk."""

    type: ClassVar[str] = "cache_clear"
    name: str | None = None


@dataclass(frozen=True)
class UsageRequest:
    """The usage log's sums per key and instance, of the records since `since` (epoch
    seconds; None: every one the log holds), of the key `key` only when given."""

    type: ClassVar[str] = "usage"
    key: str | None = None
    since: float | None = None


Request = (GetStatus | Start | Stop | RestartRequest | Reload | Wait | Watch | Logs | Pull | Models
           | RemoveModel | ClearCacheRequest | UsageRequest)
REQUESTS: dict[str, type[Any]] = {c.type: c for c in typing.get_args(Request)}
STREAMING = (Wait, Watch, Logs, Pull)  # they end when their client goes away


def decode_request(obj: dict[str, Any]) -> Request:
    msg: Request = from_wire(obj, REQUESTS, REQUEST_TAG)
    return msg


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
class DoneReply:
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
    problem: str = ""  # a folder exod does not read (a link out of the cache, a file): why


@dataclass(frozen=True)
class ModelsReply:
    cache: str
    models: list[CachedModel]
    ok: bool = True


@dataclass(frozen=True)
class RemovedReply:
    removed: str
    detail: str = ""  # what was removed: a folder and its size, or a link (its target left)
    ok: bool = True


@dataclass(frozen=True)
class ClearedCache:
    name: str
    # "runner": its running rank 0 was asked (every rank clears its own, RAM and disk);
    # "files": it was not running, and its folder on this host was emptied.
    how: str
    freed_bytes: int  # the files removed here (0 when a runner does it)
    # "files": what was met and not removed (a link, removed as a link, is said here too), or
    # why nothing was (the folder is another exod's); empty when all went as usual.
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ClearedReply:
    cleared: list[ClearedCache]
    ok: bool = True


@dataclass(frozen=True)
class UsageSums:
    key: str
    instance: str
    requests: int
    failed: int  # answered with a status of 400 or more (499: the client left)
    prompt_tokens: int
    cached_tokens: int  # of prompt_tokens: taken from the prompt cache
    completion_tokens: int
    batch_seconds: float  # from the runner's first word on each request to its end


@dataclass(frozen=True)
class UsageReply:
    folder: str  # where the log is
    sums: list[UsageSums]
    ok: bool = True


Reply = (Failure | StatusReply | StateReply | ReloadReply | WaitReply | DoneReply | PullReply
         | ModelsReply | RemovedReply | ClearedReply | UsageReply)


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
    GetStatus: StatusReply, Start: StateReply, Stop: StateReply, RestartRequest: StateReply,
    Reload: ReloadReply, Wait: WaitReply, Watch: DoneReply, Logs: DoneReply, Pull: PullReply,
    Models: ModelsReply, RemoveModel: RemovedReply, ClearCacheRequest: ClearedReply,
    UsageRequest: UsageReply}


def decode_line(obj: dict[str, Any], request: Request) -> Event | Reply:
    """One line of the answer to `request`: an event, or the final answer."""
    if EVENT_TAG in obj:
        event: Event = from_wire(obj, EVENTS, EVENT_TAG)
        return event
    reply: Reply = decode_reply(obj, EXPECTS[type(request)])
    return reply
