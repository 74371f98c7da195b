"""What each child process of exod starts from, and the questions put to the short-lived ones.

A child's command line holds its channel's descriptor alone (`--channel-fd N`). The child says
`Hello` with its protocol version first (`exod.wire.messages`); once the parent has checked it, its
first frame is one of these, checked field by field like every message, and versioned too: a
runner's `RunnerSpec`; a fetcher's `FetchSpec`, or `PlanAsk` from `exod check`, answered by one
`Planned` (or `Failed`); the split probe's `ProbeAsk`, answered by one `ProbeAnswer`.

What a runner reads of its instance's settings travels as the schema's own class
(`exod.wire.options.RunnerOptions`), and the other fields that come from the config are typed
with the schema's own aliases and have no default: no default or choice list of the config is
declared here again, and an option added to the schema reaches every runner. The rest is what
the daemon decided for this start (where a rank's layers are, the batch width, the group's
addresses). Imports nothing heavy: the daemon, `exod check` and every child use it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from exod.wire.options import Backend, RunnerOptions
from exod.core.kinds import CountOrAuto, Duration, JsonValue, ModelDir
from exod.core.shards import Parallelism, Shard
from exod.core.file_peers import PeerSource
from exod.core.hub_ref import HubRef
from exod.wire.protocol import ProtocolError


# ---- a runner ---------------------------------------------------------------------------------
# Which runner serves the model, as the daemon reads it from the model's files (exod.facts): mlx-lm
# for text, mlx-vlm for a model that sees, mlx-vlm's encoders for an embedding model or a reranker.
RunnerKind = Literal["text", "vision", "embed"]


@dataclass(frozen=True)
class GroupSpec:
    """A rank's place in its group (shards > 1). mx.distributed reads the hostfile and the rank
    from MLX_HOSTFILE and MLX_RANK, which the runner sets from here before it joins."""

    backend: Backend
    peer_timeout: Duration
    hostfile: Path  # every rank's address, as mx.distributed's ring backend reads it
    control: str  # `host:port` where rank 0 takes the group's control connections
    key_file: Path  # the group's secret (a path: the secret itself never travels)
    blas_threads: int | None  # OPENBLAS_NUM_THREADS, when several ranks share this host's cores


@dataclass(frozen=True)
class RunnerSpec:
    """Everything one rank is to do: the daemon's first frame after the runner's hello."""

    type: ClassVar[str] = "runner_spec"
    version: int
    instance: str
    model: ModelDir  # the model's directory (for a model named by hub repository, its snapshot)
    kind: RunnerKind  # the runner's path: told by the daemon, never read again by the runner
    parallelism: Parallelism
    shard: Shard  # its layers; total 0: the daemon could not count them, the rank loads all
    width: int  # generations at once: max_concurrency, or as memory admission sized it
    heartbeat: float  # seconds between heartbeats while serving
    parent_pid: int  # the daemon: the runner exits when it dies
    options: RunnerOptions
    group: GroupSpec | None
    # The instance's folder of the prompt cache's disk tier (prompt_cache_dir, or the default
    # one this daemon's environment says), each rank in a folder of its own; None: no disk tier.
    prompt_cache_folder: Path | None
    chat_template_kwargs: Mapping[str, JsonValue]  # the instance's: its `warm` prompts are chats

    def __post_init__(self) -> None:
        if self.width < 1 or not self.heartbeat > 0:
            raise ProtocolError("runner_spec: width and heartbeat must be positive")
        s = self.shard
        if not (0 <= s.rank < s.world and 0 <= s.start <= s.end <= s.total):
            raise ProtocolError(f"runner_spec.shard: {s} is impossible")
        if (s.world > 1) != (self.group is not None):
            raise ProtocolError("runner_spec.group: set exactly when the world has 2 ranks or more")


def runner_options(settings: RunnerOptions) -> RunnerOptions:
    """An instance's runner options alone (an `Instance` is one, and more)."""
    return RunnerOptions(**{f.name: getattr(settings, f.name)
                            for f in dataclasses.fields(RunnerOptions)})


# ---- a fetcher --------------------------------------------------------------------------------
@dataclass(frozen=True)
class FetchSpec:
    """Fetch one repository's snapshot into the cache (exod.hub.fetch)."""

    type: ClassVar[str] = "fetch"
    version: int
    ref: HubRef
    cache: Path
    commit: str | None  # the cache's commit for the revision: used as is, no lookup
    offline: bool
    token_file: Path | None  # read by the fetcher: the token is never in a frame, argv or env
    # Cluster peers that hold the repository, asked first, in this order (exod.hub.from_peers),
    # and the cluster's key file (read by the fetcher, as the token).
    peers: tuple[PeerSource, ...]
    cluster_key_file: Path | None


@dataclass(frozen=True)
class PlanAsk(FetchSpec):
    """What fetching would take, downloading nothing (`exod check`): one `Planned` answers."""

    type: ClassVar[str] = "plan"


@dataclass(frozen=True)
class Planned:
    """The snapshot's commit, the size of its files, the bytes still missing, the cache's free
    bytes."""

    type: ClassVar[str] = "planned"
    commit: str
    size: int
    missing: int
    free: int

    def __post_init__(self) -> None:
        if min(self.size, self.missing, self.free) < 0:
            raise ProtocolError("planned: a negative size")


# ---- the split probe --------------------------------------------------------------------------
@dataclass(frozen=True)
class Layout:
    model: ModelDir
    shards: CountOrAuto  # the schema's type; a layout asked about always has a number
    parallelism: Parallelism
    layers: tuple[int, ...] | None  # layers per rank, or an even split


@dataclass(frozen=True)
class ProbeAsk:
    """Does each layout work? Asked of the code that will run it (exod.facts.probe)."""

    type: ClassVar[str] = "probe"
    version: int
    layouts: list[Layout]


@dataclass(frozen=True)
class Verdict:
    """A layout works (`ok`), or why not: `reason` in words, `detail` the raw error it was
    translated from. `unknown`: mlx-lm cannot even build the model from its config (then the
    runner says why when it loads it)."""

    ok: bool
    reason: str | None
    detail: str | None
    model_type: str | None
    unknown: bool = False


@dataclass(frozen=True)
class ProbeAnswer:
    type: ClassVar[str] = "probe_answer"
    verdicts: list[Verdict]


RUNNER_FIRST: dict[str, type[Any]] = {RunnerSpec.type: RunnerSpec}
FETCHER_FIRST: dict[str, type[Any]] = {FetchSpec.type: FetchSpec, PlanAsk.type: PlanAsk}
PROBE_FIRST: dict[str, type[Any]] = {ProbeAsk.type: ProbeAsk}
