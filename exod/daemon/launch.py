"""How a runner or a fetcher is started: its start-up spec, its environment and, for a group,
the hostfile.

A child's command line holds its channel's descriptor alone; what it is to do goes to it as a
typed spec (exod.wire.specs), the daemon's first frame on its channel once its hello has the right
version (exod.daemon.channel). Pure but for the hostfile and the free ports of a group without
`port_base`, which it keeps in a registry while the group's ranks live (so no two groups of this
daemon share a port); the supervisor hands the result to the process table. What gets exec'd is
`exod.runner` unless the daemon's own environment names another module in EXOD_RUNNER_MODULE (a
development and test hook: chosen by whoever starts the daemon, never by a config file).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from exod.wire import messages as m
from exod.facts.embed import encoding
from exod.facts.model_dir import model_layer_count
from exod.facts.vision import sees
from exod.config.checks import port_count
from exod.config.schema import Instance
from exod.core import ports
from exod.core.shards import Shard, pipeline_shards, tensor_shards
from exod.daemon import placing, rank_addresses
from exod.daemon import spawn as os_seam
from exod.daemon.cache_owner import CacheOwner
from exod.core.file_peers import PeerSource
from exod.core.hub_ref import HubRef
from exod.wire.specs import FetchSpec, GroupSpec, RunnerKind, RunnerSpec, runner_options

M = TypeVar("M")


@dataclass(frozen=True)
class Launch(Generic[M]):
    """One child to start: `python -m MODULE --channel-fd N` with `env`, in `cwd` (the
    daemon's runtime folder, never its working directory: exod.child_start), then `spec` as
    the first frame on its channel. `decode` checks what the child says against its own union
    (a runner's messages, or a fetcher's)."""

    module: str
    spec: RunnerSpec | FetchSpec
    env: dict[str, str]
    decode: Callable[[dict[str, Any]], M]
    cwd: Path


FETCHER_MODULE = "exod.hub"


def fetcher_launch(ref: HubRef, commit: str | None, cache: Path, offline: bool,
                   token_file: Path | None, daemon_env: Mapping[str, str], cwd: Path,
                   peers: tuple[PeerSource, ...] = (), cluster_key_file: Path | None = None
                   ) -> Launch[m.FromFetcher]:
    """A fetcher of `ref` into `cache` (`commit`: the one the cache holds for its revision),
    run in `cwd`; `peers`: cluster peers that hold it, asked before the hub."""
    spec = FetchSpec(version=m.VERSION, ref=ref, cache=cache, commit=commit, offline=offline,
                     token_file=token_file, peers=peers,
                     cluster_key_file=cluster_key_file if peers else None)
    env = os_seam.runner_env(daemon_env, {"PYTHONUNBUFFERED": "1"})
    return Launch(FETCHER_MODULE, spec, env, m.decode_from_fetcher, cwd)


@dataclass(frozen=True)
class GroupPlan:
    """A group's addresses as agreed at one start, kept by its instance until the next."""

    control: str  # `address:port` where rank 0 takes the group's control connections
    ports: tuple[int, ...]  # chosen at run time (none with `port_base`): the next start avoids them


class Launcher:
    def __init__(self, run_dir: Path, daemon_env: Mapping[str, str],
                 config: Path | None = None) -> None:
        self.run_dir = run_dir
        self.daemon_env = daemon_env
        # The prompt cache's folders: the daemon run from `config` claims its own at start
        # and at each reload (exod.daemon.cache_owner).
        self.cache = CacheOwner(config, daemon_env)
        self.module = daemon_env.get("EXOD_RUNNER_MODULE") or os_seam.DEFAULT_MODULE
        self.ports = ports.Registry()

    def configure(self, instances: Iterable[Instance]) -> None:
        """The `port_base` ranges of the config: never handed out to a group without one."""
        self.ports.configured = ports.configured_ports(
            (i.port_base, port_count(i)) for i in instances if i.port_base is not None)

    def hostfile(self, name: str) -> Path:
        return self.run_dir / "groups" / f"{name}.json"

    def group_key(self, c: Instance) -> Path:
        """The group's secret: the operator's cluster_key_file, else one made at each start."""
        return c.cluster_key_file or self.run_dir / "groups" / f"{c.name}.key"

    def prepare(self, c: Instance, owner: Hashable, last: GroupPlan | None = None
                ) -> GroupPlan | None:
        """A group is about to start: agree on its addresses (write the MLX hostfile) and, for
        a group on this host alone, make its secret; None for a single rank. Its ports stay
        reserved for `owner` until `release`. A restart gets ports other than its `last`
        start's: one of those may be what failed. Raises ports.NoFreePorts or OSError."""
        if c.shards <= 1:
            return None
        chosen = None
        if c.port_base is None:
            self.ports.release(owner)
            avoid = self.ports.reserved() | set(last.ports if last is not None else ())
            chosen = rank_addresses.free_ports(c.shards + 1, avoid)
            self.ports.hold(owner, chosen)
        addrs = rank_addresses.addresses(c, chosen)
        rank_addresses.write_hostfile(self.hostfile(c.name), addrs.ranks)
        if c.cluster_key_file is None:
            rank_addresses.new_group_key(self.group_key(c))
        return GroupPlan(addrs.control, tuple(chosen or ()))

    def release(self, owner: Hashable) -> None:
        """`owner`'s ranks are all gone: its ports may go to another group."""
        self.ports.release(owner)

    def launch(self, c: Instance, shard: Shard, local_ranks: int, width: int,
               plan: GroupPlan | None = None) -> Launch[m.FromRunner]:
        """`plan`: what `prepare` agreed for the group (required with more than one rank)."""
        group = None
        if shard.world > 1:
            assert plan is not None, "a group's ranks start after `prepare`"
            threads = rank_addresses.thread_split(c, local_ranks, self.daemon_env)
            group = GroupSpec(backend=c.backend, peer_timeout=c.peer_timeout,
                              hostfile=self.hostfile(c.name),
                              control=plan.control, key_file=self.group_key(c),
                              blas_threads=threads)
        spec = RunnerSpec(version=m.VERSION, instance=c.name, model=c.model,
                          kind=runner_kind(c.model), parallelism=c.parallelism, shard=shard,
                          width=width, heartbeat=m.HEARTBEAT_EVERY, parent_pid=os.getpid(),
                          options=runner_options(c), group=group,
                          prompt_cache_folder=self.cache.folder(c)
                          if c.prompt_cache_disk_bytes > 0 else None,
                          chat_template_kwargs=dict(c.chat_template_kwargs))
        return Launch(self.module, spec, self.env(c, shard.rank), m.decode_from_runner,
                      self.run_dir)

    def env(self, c: Instance | None, rank: int = 0) -> dict[str, str]:
        """A rank's environment; with no instance, what every rank without an `env:` of its
        own shares (the zygote's: exod.daemon.zygote)."""
        own: dict[str, str] = {**c.env} if c is not None else {}
        own.update({
            "PYTHONUNBUFFERED": "1",
            "HF_HUB_OFFLINE": "1",  # models are local; never wait on a hub
        })
        if c is not None:
            # For people and their tools (ps, /proc): the runner reads its spec, not these.
            own.update({"EXOD_INSTANCE": c.name, "EXOD_RANK": str(rank)})
        return os_seam.runner_env(self.daemon_env, own)


def runner_kind(model: Path) -> RunnerKind:
    """Which runner serves the model, told by its own files (exod.facts), once, here."""
    if encoding(model) is not None:
        return "embed"
    return "vision" if sees(model) is not None else "text"


def plan_shards(inst: Instance, log: placing.Log | None = None) -> list[Shard]:
    """Layer ranges per rank: the planner's for `placement: auto` (exod.daemon.placing, which
    tells `log`). An unknown layer count (0) lets the runner load everything."""
    total = model_layer_count(inst.model) or 0
    if total == 0:
        world = max(1, inst.shards)
        return [Shard(r, world, 0, 0, 0) for r in range(world)]
    if inst.placement == "auto":
        return placing.local_shards(inst, total, log)
    if inst.parallelism == "tensor":
        return tensor_shards(total, inst.shards)
    return pipeline_shards(total, inst.shards, inst.layers)
