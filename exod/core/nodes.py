"""What a node of a cluster is, as the others see it: what it announces (`NodeInfo`, the models
it holds as `NodeModel`s) and how fast the link between two nodes is (`Link`).

Discovery (exod.daemon.cluster) fills these from signed announcements; placement reads them.
Plain data, no I/O; docs/cluster.md says what each field is measured from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Backend = Literal["metal", "cuda", "cpu"]


@dataclass(frozen=True)
class NodeModel:
    name: str  # hub name (org/repo) or a local model's folder name
    revision: str = ""  # hub commit, or "" for a local model


@dataclass(frozen=True)
class NodeInfo:
    """What a node announces (and what placement reads)."""

    node_id: str  # stable per daemon (made once, kept in its state folder)
    name: str  # host name, for people
    backend: str  # a Backend
    memory_total: int  # bytes
    memory_usable: int  # bytes exod may use for weights + KV (after headroom)
    disk_free: int  # bytes free where models are kept
    models: tuple[NodeModel, ...] = ()
    addresses: tuple[str, ...] = ()  # IPs other nodes reach it at
    api_port: int = 0  # its HTTP API port
    control_port: int = 0  # where peers reach it for cluster traffic (0: none yet)
    # The instances whose rank 0 it runs, by name: its API serves them, and any node's sends
    # their requests on to it (exod.core.upstream).
    serves: tuple[str, ...] = ()


@dataclass(frozen=True)
class Link:
    a: str  # node_ids
    b: str
    seconds_per_mib: float  # measured (lower is faster); absent: unknown
