"""What the HTTP API needs of the daemon: a narrow view, so the API never imports the
supervisor (which starts it). Instances are the daemon's own runtimes, each holding its
request lane and idle clock; a request asks the daemon's `traffic` once (`admit`: a lease on
the instance, with on-demand start, queue and hang watch)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from exod.core.nodes import NodeInfo
    from exod.daemon.hub_models import HubModels
    from exod.daemon.instance import InstanceRuntime
    from exod.daemon.reload import Reloader
    from exod.wire.control_status import Snapshot
    from exod.daemon.log_ring import LogRings
    from exod.daemon.traffic import Traffic
    from exod.daemon.usage.keeper import UsageKeeper


class DaemonView(Protocol):
    @property
    def phase(self) -> str: ...

    @property
    def stopping(self) -> bool: ...

    @property
    def started(self) -> float:
        """time.monotonic() when the daemon started."""
        ...

    @property
    def reloader(self) -> Reloader:
        """Its reloads, counted for /metrics."""
        ...

    @property
    def logs(self) -> LogRings: ...

    @property
    def traffic(self) -> Traffic: ...

    @property
    def usage(self) -> UsageKeeper:
        """The keys' limits, their usage and the audit log."""
        ...

    def instance(self, name: str) -> InstanceRuntime | None: ...

    def serving(self, name: str) -> InstanceRuntime | None:
        """The instance a request's `model` names (its own name or an alias)."""
        ...

    def ordered(self) -> Sequence[InstanceRuntime]: ...

    def nodes(self) -> Sequence[NodeInfo]:
        """The cluster's members as discovery knows them (this node first); none without
        discovery. Where the API finds another node's API port (exod.core.upstream)."""
        ...

    @property
    def node_name(self) -> str:
        """This node's `node.name`."""
        ...

    def snapshot(self) -> Snapshot: ...

    def now(self) -> float:
        """The seam's monotonic clock (the idle stop's deadlines are on it)."""
        ...

    # ---- models named by hub repository (Ollama's /api/pull, /api/delete) -----------------
    @property
    def instances(self) -> dict[str, InstanceRuntime]: ...

    @property
    def hub(self) -> HubModels:
        """The cache, `pull`, downloads, and where an instance's model is now."""
        ...
