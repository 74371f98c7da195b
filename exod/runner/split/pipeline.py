"""Pipeline parallelism that keeps the model's own forward on every rank.

Every rank builds the whole model (lazily: no weights read) and runs its forward unchanged.
The blocks a rank does not own become stand-ins: the same objects, so every attribute the
model's forward or its `make_cache` reads stays right (sliding-window flags, conv vs attention
layers, dense vs MoE, no-rope layers, all chosen by the block's index), but their call only
passes the hidden state through and moves their cache's position on by the step's length, as
the real block would, so masks built from any layer's cache stay right. Their weights are never
evaluated, hence never read from disk.

The rank's first owned block receives the hidden state from the previous rank in place of its
input, and its last owned block sends its output to the next rank. The communication is part
of the model's graph: any code that calls the model and evaluates what it needs (the last
rank's logits, `PipeLink.pending` elsewhere) drives the group.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import mlx.core as mx
from mlx import nn

from exod.core.shards import Shard
from exod.runner.split.blocks import Blocks

_CACHE_NAMES = ("cache", "c", "layer_cache", "kv_cache", "past_key_value", "prompt_cache")


class PipeLink:
    """A rank's connections to its neighbours in the pipeline."""

    def __init__(self, group: Any, rank: int, size: int) -> None:
        self.group, self.rank, self.size = group, rank, size
        self.pending: list[mx.array] = []  # sends of the forward being built

    def receive(self, like: mx.array) -> mx.array:
        return mx.distributed.recv(like.shape, like.dtype, self.rank - 1, group=self.group)

    def send(self, h: mx.array) -> None:
        self.pending.append(mx.distributed.send(h, self.rank + 1, group=self.group))

    def take_pending(self) -> list[mx.array]:
        out, self.pending = self.pending, []
        return out


def install(blocks: Blocks, shard: Shard, link: PipeLink | None) -> None:
    """Turn the blocks outside [start, end) into stand-ins and wire the owned ends to the
    neighbours (no wiring without a link: a probe checks the forward alone)."""
    for i, block in enumerate(blocks.items):
        if not shard.start <= i < shard.end:
            _swap(block, _stand_in(type(block)))
            continue
        receive = link is not None and i == shard.start and not shard.first
        send = link is not None and i == shard.end - 1 and not shard.last
        if receive or send:
            assert link is not None
            _swap(block, _owned_end(type(block), link, receive, send))


def _swap(block: nn.Module, cls: type) -> None:
    # The same object with a subclass: attributes, cache layout and index stay the block's own.
    block.__class__ = cls


def _call_parts(base: type) -> tuple[Callable[..., Any], str, str | None]:
    """The block's forward, the name of its input and of its cache argument (or None)."""
    call = base.__call__
    params = list(inspect.signature(call).parameters)[1:]  # after self
    cache = next((p for p in params if p in _CACHE_NAMES), None)
    if cache is None:
        cache = next((p for p in params if "cache" in p), None)
    return call, params[0] if params else "x", cache


def _stand_in(base: type) -> type:
    call, first, cache_name = _call_parts(base)
    sig = inspect.signature(call)

    def __call__(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        bound = sig.bind_partial(self, *args, **kwargs).arguments
        x = bound[first]
        if cache_name is not None:
            _advance(bound.get(cache_name), x)
        return x

    return type(f"StandIn{base.__name__}", (base,), {"__call__": __call__,
                                                     "exod_stand_in": True})


def _owned_end(base: type, link: PipeLink, receive: bool, send: bool) -> type:
    call, first, _ = _call_parts(base)

    def __call__(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        rest, kwargs = list(args), dict(kwargs)
        x = rest[0] if rest else kwargs[first]
        if receive:
            x = link.receive(x)
            if rest:
                rest[0] = x
            else:
                kwargs[first] = x
        out = call(self, *rest, **kwargs)
        if send:
            h = out[0] if isinstance(out, tuple) else out
            # In the dtype the next rank expects: that of its own (embedding's) input.
            link.send(h.astype(x.dtype) if h.dtype != x.dtype else h)
        return out

    return type(f"Pipelined{base.__name__}", (base,), {"__call__": __call__})


def _advance(cache: Any, x: mx.array) -> None:
    """Move a stand-in's cache on as the real block would: one tiny slot per position, so
    offsets, rotation and trimming behave the same while holding almost nothing."""
    if cache is None:
        return
    inner = getattr(cache, "caches", None)
    if inner is not None:  # CacheList: a block with several caches
        for c in inner:
            _advance(c, x)
        return
    if hasattr(cache, "update_and_fetch") and hasattr(cache, "offset") and x.ndim >= 2:
        z = mx.zeros((x.shape[0], 1, x.shape[1], 1), dtype=x.dtype)
        cache.update_and_fetch(z, z)
    elif isinstance(getattr(cache, "cache", None), list) and hasattr(cache, "advance") \
            and x.ndim >= 2:
        # ArraysCache (conv / recurrent state): a tiny state per row, so that the batch's
        # merges, filters and extractions find one, and its lengths and padding move on as
        # the real layer's do (the model may build a mask from this very cache).
        batch = x.shape[0]
        for i, state in enumerate(cache.cache):
            if state is None or state.shape[0] != batch:
                cache.cache[i] = mx.zeros((batch, 1), dtype=x.dtype)
        cache.advance(x.shape[1])


def handoff_problem(blocks: Blocks, forward: Callable[[], Any],
                    shards: list[Shard]) -> str | None:
    """Why the blocks cannot be split between these ranks, or None. A block that hands the
    next one more than the hidden state (shared keys and values, a first layer's values,
    hyper-connection streams) cannot have a stand-in, and no rank could receive that state;
    a block that reads another block's cache (gemma3n's KV-shared layers) needs that block
    on its own rank. `forward` runs the unsplit model (lazily: nothing is evaluated)."""
    returned: dict[str, int] = {}
    caches: dict[int, list[int]] = {}  # id of a cache object -> the blocks given it
    classes = [type(b) for b in blocks.items]
    for i, (block, base) in enumerate(zip(blocks.items, classes, strict=True)):
        _, _, cache_name = _call_parts(base)
        sig = inspect.signature(base.__call__)

        def __call__(self: nn.Module, *args: Any, _base: type = base, _i: int = i,
                     _name: str | None = cache_name, _sig: Any = sig, **kwargs: Any) -> Any:
            if _name is not None:
                cache = _sig.bind_partial(self, *args, **kwargs).arguments.get(_name)
                if cache is not None:
                    caches.setdefault(id(cache), []).append(_i)
            out = _base.__call__(self, *args, **kwargs)
            if isinstance(out, (tuple, list)):
                returned.setdefault(_base.__name__, len(out))
            return out

        _swap(block, type(f"Watched{base.__name__}", (base,), {"__call__": __call__}))
    try:
        forward()
    finally:
        for block, base in zip(blocks.items, classes, strict=True):
            _swap(block, base)
    for name, n in returned.items():
        return (f"its layers hand the next layer more than the hidden state ({name} returns "
                f"{n} values): a pipeline passes only the hidden state between ranks")
    rank_of = {i: s.rank for s in shards for i in range(s.start, s.end)}
    for users in caches.values():
        if len({rank_of.get(i) for i in users}) > 1:
            return (f"layer {users[-1]} reads the cache of layer {users[0]} (shared keys and "
                    "values), which this split puts on another rank")
    return None


def is_stand_in(block: nn.Module) -> bool:
    return bool(getattr(type(block), "exod_stand_in", False))
