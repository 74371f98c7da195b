"""How a runner is started: its argv, its environment and, for a group, the hostfile.

Pure but for the hostfile and the free ports of a group without `port_base`, which it keeps
in a registry while the group's ranks live (so no two groups of this daemon share a port);
the supervisor hands the result to the process table. What gets exec'd is `exod.runner`
unless the daemon's own environment names another module in EXOD_RUNNER_MODULE (a development
and test hook: chosen by whoever starts the daemon, never by a config file).
"""

from __future__ import annotations

import json
import os
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from exod import messages as m
from exod import paths
from exod.config.checks import port_count
from exod.config.schema import Instance
from exod.core import ports
from exod.config import model_layer_count
from exod.core.grammar_limits import EngineLimits
from exod.core.shards import Shard, pipeline_shards, tensor_shards
from exod.daemon import rank_addresses
from exod.daemon import spawn as os_seam



@dataclass(frozen=True)
class Launch:
    module: str
    args: list[str]
    env: dict[str, str]


class Launcher:
    def __init__(self, run_dir: Path, daemon_env: Mapping[str, str]) -> None:
        self.run_dir = run_dir
        self.daemon_env = daemon_env
        self.module = daemon_env.get("EXOD_RUNNER_MODULE") or os_seam.DEFAULT_MODULE
        self._group_control: dict[str, str] = {}  # instance → rank 0's control address
        self.ports = ports.Registry()
        self._last: dict[str, tuple[int, ...]] = {}  # instance → the ports of its last start

    def configure(self, instances: Iterable[Instance]) -> None:
        """The `port_base` ranges of the config: never handed out to a group without one."""
        self.ports.configured = ports.configured_ports(
            (i.port_base, port_count(i)) for i in instances if i.port_base is not None)

    def hostfile(self, name: str) -> Path:
        return self.run_dir / "groups" / f"{name}.json"

    def group_key(self, c: Instance) -> Path:
        """The group's secret: the operator's cluster_key_file, else one made at each start."""
        return c.cluster_key_file or self.run_dir / "groups" / f"{c.name}.key"

    def prepare(self, c: Instance, owner: Hashable) -> None:
        """A group is about to start: agree on its addresses (write the MLX hostfile) and, for
        a group on this host alone, make its secret. Its ports stay reserved for `owner` until
        `release`. A restart gets ports other than the last start's: one of those may be what
        failed. Raises ports.NoFreePorts or OSError."""
        if c.shards > 1:
            chosen = None
            if c.port_base is None:
                self.ports.release(owner)
                avoid = self.ports.reserved() | set(self._last.get(c.name, ()))
                chosen = rank_addresses.free_ports(c.shards + 1, avoid)
                self.ports.hold(owner, chosen)
                self._last[c.name] = tuple(chosen)
            addrs = rank_addresses.addresses(c, chosen)
            rank_addresses.write_hostfile(self.hostfile(c.name), addrs.ranks)
            if c.cluster_key_file is None:
                rank_addresses.new_group_key(self.group_key(c))
            self._group_control[c.name] = addrs.control

    def release(self, owner: Hashable) -> None:
        """`owner`'s ranks are all gone: its ports may go to another group."""
        self.ports.release(owner)

    def launch(self, c: Instance, shard: Shard, local_ranks: int, width: int) -> Launch:
        args = ["--model", str(c.model), "--instance", c.name, "--rank", str(shard.rank),
                "--world", str(shard.world), "--parallelism", c.parallelism, "--dtype", c.dtype,
                "--parent-pid", str(os.getpid()), "--heartbeat", f"{m.HEARTBEAT_EVERY:g}",
                "--max-concurrency", str(width),
                "--prompt-cache-bytes", str(c.prompt_cache_bytes),
                "--grammar-limits", EngineLimits(
                    c.grammar.max_size, c.grammar.max_lexer_states, c.grammar.compile_fuel,
                    c.grammar.step_fuel).arg()]
        if shard.total:
            args += ["--layers", shard.arg(), "--total-layers", str(shard.total)]
        args += generation_args(c) + self.prompt_cache_args(c, shard)
        group_env: dict[str, str] = {}
        if shard.world > 1:
            args += ["--backend", c.backend, "--peer-timeout", f"{c.peer_timeout:g}"]
            # mx.distributed's own interface: which rank, and where every rank listens.
            group_env = {"MLX_RANK": str(shard.rank), "MLX_HOSTFILE": str(self.hostfile(c.name)),
                         "EXOD_GROUP_CONTROL": self._group_control[c.name],
                         **rank_addresses.group_secrets(self.group_key(c))}
        env = os_seam.runner_env(self.daemon_env, {
            **rank_addresses.thread_split(c, local_ranks, self.daemon_env),
            **c.env,
            **group_env,
            "PYTHONUNBUFFERED": "1",
            "HF_HUB_OFFLINE": "1",  # models are local; never wait on a hub
            "EXOD_INSTANCE": c.name,
            "EXOD_RANK": str(shard.rank),
        })
        return Launch(self.module, args, env)


    def prompt_cache_args(self, c: Instance, shard: Shard) -> list[str]:
        """The disk tier's folder and budget; rank 0's warm prompts (the others follow it)."""
        args: list[str] = []
        if c.prompt_cache_disk_bytes > 0:
            args += ["--prompt-cache-dir", str(prompt_cache_folder(c, self.daemon_env)),
                     "--prompt-cache-disk-bytes", str(c.prompt_cache_disk_bytes)]
        if shard.rank == 0 and c.warm:
            for path in c.warm:
                args += ["--warm", str(path)]
            args += ["--chat-template-kwargs", json.dumps(dict(c.chat_template_kwargs))]
        return args


def prompt_cache_folder(c: Instance, env: Mapping[str, str]) -> Path:
    """The instance's own folder of the disk tier (`exoctl cache clear` empties it)."""
    return (c.prompt_cache_dir or paths.prompt_cache_base(env, os.geteuid())) / c.name


def plan_shards(inst: Instance) -> list[Shard]:
    """Layer ranges per rank. An unknown layer count (0) lets the runner load everything."""
    total = model_layer_count(inst.model) or 0
    if total == 0:
        return [Shard(r, inst.shards, 0, 0, 0) for r in range(inst.shards)]
    if inst.parallelism == "tensor":
        return tensor_shards(total, inst.shards)
    return pipeline_shards(total, inst.shards, inst.layers)


def generation_args(c: Instance) -> list[str]:
    """mlx-lm's generation options, as the runner takes them (only those set)."""
    args: list[str] = []
    if c.kv_bits is not None:
        args += ["--kv-bits", str(c.kv_bits), "--kv-group-size", str(c.kv_group_size),
                 "--quantized-kv-start", str(c.quantized_kv_start)]
    if c.max_kv_size is not None:
        args += ["--max-kv-size", str(c.max_kv_size)]
    if c.draft_model is not None:
        args += ["--draft-model", str(c.draft_model),
                 "--num-draft-tokens", str(c.num_draft_tokens)]
    if c.adapters is not None:
        args += ["--adapters", str(c.adapters)]
    if c.wired_limit is not None:
        args += ["--wired-limit", str(c.wired_limit)]
    return args
