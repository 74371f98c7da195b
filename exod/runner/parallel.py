"""Running one model across the ranks of a group: pipeline (each rank owns a layer range) or
tensor parallel (every rank owns a slice of every layer).

Rank 0 serves requests with mlx-lm's own generation code, through `LeaderModel`, a stand-in
for the model whose forward pass drives the whole group: it sends a header and the tokens to
every rank, then every rank runs the model's own forward (`Forward`): the hidden state travels
rank 0 → 1 → … → N-1 inside it (pipeline, see exod.runner.pipeline) or every rank computes with
all_sum inside the sharded layers (tensor), and the logits come back to rank 0, which samples.
The other ranks run `worker_loop`, doing whatever the headers say.

Every forward pass is evaluated eagerly, on every rank, in the same order: mlx-lm evaluates
lazily and sometimes not at all (prefill chunks, the look-ahead step after the last token), and
a send that nobody receives would desynchronise the group.

Each generation has its own KV cache on every rank, named by a cache id in the headers, so
several generations can take turns token by token (exod.runner.sequential.TurnEngine).
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any

import mlx.core as mx
from mlx import nn

from exod.runner.peers import Cmd, Group
from exod.runner.lifecycle import Lifecycle
from exod.runner.load import Loaded

class GroupCache(list[Any]):
    """This rank's KV caches for one generation, tagged with the id the headers use."""

    cache_id: int = 0


class Forward:
    """One forward pass of the whole group, run the same way on every rank: the model's own
    forward (a pipeline rank's stand-ins and sends/receives, or a tensor rank's sharded layers
    and all_sums live inside it), then the last position's logits reach rank 0."""

    def __init__(self, loaded: Loaded, group: Group, parallelism: str) -> None:
        self.model = loaded.model
        self.link = loaded.link
        self.shard = loaded.shard
        self.group = group
        self.parallelism = parallelism

    def __call__(self, tokens: mx.array, cache: list[Any]) -> mx.array | None:
        """The last position's logits on rank 0, None on the other ranks."""
        g, length = self.group, int(tokens.shape[1])
        out = self.model(tokens, cache=cache)
        logits = out[:, -1:, :]
        if self.parallelism == "tensor" or g.size == 1:
            g.compute(logits, length)
            return logits if g.rank == 0 else None
        if self.shard.last:
            g.send(logits, 0, length)  # evaluates this rank's part of the forward too
            return None
        assert self.link is not None
        g.compute(self.link.take_pending(), length)
        if g.rank != 0:
            return None
        return g.recv(tuple(logits.shape), logits.dtype, g.size - 1, length)

    def warm_up(self, first_token: int) -> None:
        """One real token through every rank before READY: rank 0 hands out the token."""
        g = self.group
        tokens = mx.array([[first_token]], dtype=mx.int32)
        if g.rank == 0:
            for dst in range(1, g.size):
                g.send(tokens, dst)
        else:
            tokens = g.recv((1, 1), mx.int32, 0)
        self(tokens, _new_cache(self.model))


class LeaderModel:
    """What rank 0 hands to mlx-lm's generation code in place of the model."""

    def __init__(self, loaded: Loaded, group: Group, parallelism: str) -> None:
        self.loaded = loaded
        self.group = group
        self.forward = Forward(loaded, group, parallelism)
        self._ids = itertools.count(1)
        self._freed: list[int] = []  # caches whose generation ended, announced with the next header
        self.layers = loaded.model.layers  # mlx-lm checks len(layers) against the cache

    # mlx-lm's make_prompt_cache(model) calls this once per generation
    def make_cache(self) -> GroupCache:
        self._flush_freed()
        cache = GroupCache(_new_cache(self.loaded.model))
        cache.cache_id = next(self._ids)
        self.group.send_header(Cmd.NEW_CACHE, cache.cache_id)
        weakref.finalize(cache, self._freed.append, cache.cache_id)
        return cache

    def _flush_freed(self) -> None:
        while self._freed:
            self.group.send_header(Cmd.FREE_CACHE, self._freed.pop())

    def __call__(self, inputs: mx.array, cache: GroupCache, **_: Any) -> mx.array:
        self._flush_freed()
        g, length = self.group, int(inputs.shape[1])
        g.send_header(Cmd.FORWARD, cache.cache_id, length)
        tokens = inputs.astype(mx.int32)
        for dst in range(1, g.size):
            g.send(tokens, dst)
        logits = self.forward(tokens, cache)
        assert logits is not None
        return logits

    def heartbeat(self) -> None:
        self._flush_freed()
        self.group.send_header(Cmd.HEARTBEAT)
        self.group.barrier()

    def shutdown(self) -> None:
        self.group.send_header(Cmd.SHUTDOWN)
        self.group.barrier()  # so no peer sees a closed socket before everyone is done


def worker_loop(loaded: Loaded, group: Group, parallelism: str, life: Lifecycle) -> None:
    """Ranks 1..N-1: follow rank 0's headers until SHUTDOWN (clean) or the group breaks."""
    forward = Forward(loaded, group, parallelism)
    model = loaded.model
    caches: dict[int, list[Any]] = {}
    while True:
        # Idle here is interruptible: a stop request waits briefly for rank 0's SHUTDOWN (the
        # usual case: the daemon asks every rank at once), then leaves anyway.
        with life.interruptible(grace=2.0):
            cmd, cache_id, length = group.recv_header()
        if cmd is Cmd.FORWARD:
            cache = caches.get(cache_id)
            if cache is None:  # should not happen; a fresh cache keeps the group in step
                cache = caches[cache_id] = _new_cache(model)
            forward(group.recv((1, length), mx.int32, 0), cache)
        elif cmd is Cmd.NEW_CACHE:
            caches[cache_id] = _new_cache(model)
        elif cmd is Cmd.FREE_CACHE:
            caches.pop(cache_id, None)
        elif cmd is Cmd.HEARTBEAT:
            group.barrier()
        elif cmd is Cmd.SHUTDOWN:
            group.barrier()
            return


def warm_up(loaded: Loaded, group: Group | None) -> None:
    """One token through the model (and every rank of its group), with a fresh cache."""
    tok = loaded.tokenizer
    first = next((t for t in (getattr(tok, "bos_token_id", None),
                              getattr(tok, "eos_token_id", None)) if isinstance(t, int)), 0)
    if group is None:
        mx.eval(loaded.model(mx.array([[first]]), cache=_new_cache(loaded.model)))
        return
    Forward(loaded, group, loaded.parallelism).warm_up(first)


def _new_cache(model: nn.Module) -> list[Any]:
    """A cache per block, stand-ins included (they keep positions, not keys and values)."""
    from mlx_lm.models.cache import make_prompt_cache

    return list(make_prompt_cache(model))
