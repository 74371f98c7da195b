"""Memory admission in the daemon: refuse a start that would not fit, before any runner spawns.

The estimate comes from `exod.core.memory` (safetensors headers); what the host can give comes
from `procinfo.available_bytes`. Instances already running have not taken all of theirs yet (a
load in progress, a KV cache that grows with requests), so what they may still take is set
aside for them. Only this host's ranks count: in a multi-host
group each host checks its own.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable

from exod.config.model_dir import model_config
from exod.config.schema import Instance
from exod.core.memory import Estimate, HeaderError, estimate, model_tensors, refusal
from exod.core.shards import Shard
from exod.core.states import State
from exod.daemon.instance import InstanceRuntime
from exod.daemon.procinfo import available_bytes, rss_bytes

ON_CPU = sys.platform != "darwin"  # mlx runs on the CPU on Linux, on the GPU on macOS


def estimates(cfg: Instance, shards: Iterable[Shard]) -> list[Estimate]:
    """Per rank; raises HeaderError or OSError when the weights cannot be read."""
    tensors = model_tensors(cfg.model)
    config = model_config(cfg.model)
    return [estimate(tensors, config, s, cfg.parallelism, cfg.dtype, ON_CPU,
                     cfg.max_concurrency, cfg.context_tokens) for s in shards]


class MemoryCheck:
    def __init__(self, headroom: int,
                 available: Callable[[int], int | None] = available_bytes,
                 rss: Callable[[int], int | None] = rss_bytes) -> None:
        self.headroom = headroom
        self.available = available
        self.rss = rss

    def need(self, inst: InstanceRuntime) -> int | None:
        """Bytes this host's ranks of `inst` need; None when it cannot be estimated (the runner
        will then report what is wrong with the weights itself)."""
        try:
            return sum(e.total for e in estimates(inst.config, [r.shard for r in inst.ranks
                                                                if r.local]))
        except (HeaderError, OSError) as e:
            inst.log.warning("no memory estimate: {}", e)
            return None

    def figures(self, inst: InstanceRuntime,
                others: Iterable[InstanceRuntime]) -> tuple[int, int, int] | None:
        """(need, available, reserved by other loads) in bytes; None if it cannot be told."""
        others = list(others)
        inst.memory_need = need = self.need(inst)
        if need is None:
            return None
        live = [r.pid for o in others for r in o.ranks if r.pid is not None]
        try:
            available = self.available(sum(self.rss(p) or 0 for p in live))
        except ValueError as e:  # a bad EXOD_MEMORY_AVAILABLE
            inst.log.warning("no memory check: EXOD_MEMORY_AVAILABLE: {}", e)
            return None
        if available is None:
            return None
        return need, available, sum(self.still_to_take(o) for o in others if o is not inst)

    def refuse(self, inst: InstanceRuntime, others: Iterable[InstanceRuntime]) -> str | None:
        f = self.figures(inst, others)
        return None if f is None else refusal(f[0], f[1], self.headroom, f[2])

    def missing(self, inst: InstanceRuntime, others: Iterable[InstanceRuntime]) -> int:
        """Bytes short of what `inst` needs (0 or less: it fits, or it cannot be told)."""
        f = self.figures(inst, others)
        return 0 if f is None else f[0] - (f[1] - self.headroom - f[2])

    def still_to_take(self, inst: InstanceRuntime) -> int:
        """What an instance may still grow by: a load in progress, or a ready instance's KV
        cache as its requests come."""
        if inst.state not in (State.STARTING, State.LOADING, State.READY) or not inst.memory_need:
            return 0
        taken = sum(self.rss(r.pid) or 0 for r in inst.ranks if r.pid is not None)
        return max(0, inst.memory_need - taken)


def describe(cfg: Instance, shards: list[Shard], node: str) -> list[str]:
    """`exod check`'s lines for one instance: each local rank's estimate."""
    from exod.daemon.rank_addresses import host_of

    local = [s for s in shards if host_of(cfg, s.rank, node) == node]
    if not local:
        return [f"{cfg.name}: every rank runs on another host"]
    try:
        per_rank = estimates(cfg, local)
    except (HeaderError, OSError) as e:
        return [f"{cfg.name}: no memory estimate: {e}"]
    return [f"{cfg.name}: needs {e.describe()}" + (f" for rank {s.rank}" if cfg.shards > 1
                                                    else "")
            for s, e in zip(local, per_rank, strict=True)]
