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

from exod.facts.model_dir import model_config
from exod.facts.vision import tower
from exod.config.schema import Instance
from exod.facts.embed import encoding
from exod.core.memory import (Estimate, HeaderError, KvSpec, auto_width, encoder_estimate,
                              estimate, model_tensors, refusal)
from exod.core.serving import EMBED_BATCH_TOKENS
from exod.core.shards import Shard
from exod.core.states import State
from exod.daemon.instance import InstanceRuntime
from exod.daemon.procinfo import available_bytes, rss_bytes

ON_CPU = sys.platform != "darwin"  # mlx runs on the CPU on Linux, on the GPU on macOS
AUTO_FREE_UNKNOWN = 0  # what is free cannot be told: an unset max_concurrency stays at 1


def estimates(cfg: Instance, shards: Iterable[Shard], width: int | None = None
              ) -> list[Estimate]:
    """Per rank, for `width` generations (default max_concurrency, else one); raises
    HeaderError or OSError when the weights cannot be read."""
    tensors = model_tensors(cfg.model)
    config = model_config(cfg.model)
    enc = encoding(cfg.model)
    if enc is not None:  # an embedding model or a reranker: one rank, no KV cache
        return [encoder_estimate(tensors, config, cfg.dtype, ON_CPU, enc.max_tokens,
                                 EMBED_BATCH_TOKENS) for _ in shards]
    kv = KvSpec(cfg.kv_bits, cfg.kv_group_size, cfg.quantized_kv_start, cfg.max_kv_size)
    draft = None
    if cfg.draft_model is not None and cfg.draft_model.is_dir():  # not a hub name not fetched
        draft = (model_tensors(cfg.draft_model), model_config(cfg.draft_model))
    sight = tower(cfg.model)
    return [estimate(tensors, config, s, cfg.parallelism, cfg.dtype, ON_CPU,
                     width or cfg.max_concurrency or 1, cfg.context_tokens, kv, draft, sight)
            for s in shards]


def scaled(one: list[Estimate], width: int) -> int:
    """Bytes for `width` generations, from estimates made for one."""
    return sum(e.weights + e.runtime + e.vision + width * e.kv for e in one)


class MemoryCheck:
    def __init__(self, headroom: int,
                 available: Callable[[int], int | None] = available_bytes,
                 rss: Callable[[int], int | None] = rss_bytes) -> None:
        self.headroom = headroom
        self.available = available
        self.rss = rss

    def need(self, inst: InstanceRuntime) -> list[Estimate] | None:
        """This host's ranks' estimates for one generation each (the width scales the KV
        cache); None when it cannot be estimated (the runner will then report what is wrong
        with the weights itself)."""
        try:
            return estimates(inst.config, [r.shard for r in inst.ranks if r.local], 1)
        except (HeaderError, OSError) as e:
            inst.log.warning("no memory estimate: {}", e)
            return None

    def figures(self, inst: InstanceRuntime,
                others: Iterable[InstanceRuntime]) -> tuple[int, int, int] | None:
        """(need, available, reserved by other loads) in bytes; None if it cannot be told."""
        others = list(others)
        one = self.need(inst)
        if one is None:
            inst.sized(None, inst.auto_width)
            return None
        live = [r.pid for o in others for r in o.ranks if r.pid is not None]
        try:
            available = self.available(sum(self.rss(p) or 0 for p in live))
        except ValueError as e:  # a bad EXOD_MEMORY_AVAILABLE
            inst.log.warning("no memory check: EXOD_MEMORY_AVAILABLE: {}", e)
            available = None
        reserved = sum(self.still_to_take(o) for o in others if o is not inst)
        width = inst.auto_width
        if inst.config.max_concurrency is None:
            free = AUTO_FREE_UNKNOWN if available is None else \
                available - self.headroom - reserved
            width = auto_width(one, free)
            inst.log.info("batch width {} (sized by memory admission)", width)
        need = scaled(one, inst.config.max_concurrency or width or 1)
        inst.sized(need, width)
        if available is None:
            return None
        return need, available, reserved

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


def describe(cfg: Instance, shards: list[Shard], node: str, headroom: int = 0) -> list[str]:
    """`exod check`'s lines for one instance: each local rank's estimate."""
    from exod.daemon.rank_addresses import host_of

    local = [s for s in shards if host_of(cfg, s.rank, node) == node]
    if not local:
        return [f"{cfg.name}: every rank runs on another host"]
    try:
        width = cfg.max_concurrency
        note = ""
        if encoding(cfg.model) is not None:
            note = (f"; an encoder: no KV cache, the runtime holds a batch of "
                    f"{EMBED_BATCH_TOKENS} tokens")
        elif width is None:
            free = (available_bytes(0) or AUTO_FREE_UNKNOWN) - headroom
            width = auto_width(estimates(cfg, local, 1), free)
            note = (f"; batch width {width} (max_concurrency unset: sized by memory, KV for "
                    f"{width} × {cfg.context_tokens} tokens)")
        per_rank = estimates(cfg, local, width)
    except (HeaderError, OSError) as e:
        return [f"{cfg.name}: no memory estimate: {e}"]
    return [f"{cfg.name}: needs {e.describe()}" + (f" for rank {s.rank}" if cfg.shards > 1
                                                    else "") + note
            for s, e in zip(local, per_rank, strict=True)]
