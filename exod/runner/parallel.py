"""Running one model across the ranks of a group: pipeline (each rank owns a layer range) or
tensor parallel (every rank owns a slice of every layer).

Rank 0 serves requests with mlx-lm's own generation code, through `LeaderModel`, a stand-in
for the model whose forward pass drives the whole group: it sends a header to every rank, then
the activations travel rank 0 → 1 → … → N-1 (pipeline) or every rank computes with all_sum
inside the sharded layers (tensor), and the logits come back to rank 0, which samples. The other
ranks run `worker_loop`, doing whatever the headers say.

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
from exod.runner.load import Loaded, find_layers_owner, flat_arrays

NORM_NAMES = ("norm", "final_layernorm", "ln_f", "final_norm", "norm_f")


class GroupCache(list[Any]):
    """This rank's KV caches for one generation, tagged with the id the headers use."""

    cache_id: int = 0


def _call(module: nn.Module, inputs: mx.array, cache: list[Any], h: mx.array | None) -> mx.array:
    """A forward pass from the tokens, or from the previous rank's hidden state `h`."""
    if h is None:
        return module(inputs, cache=cache)
    return module(inputs, cache=cache, input_embeddings=h)


class Stage:
    """This rank's part of a pipeline: its layers, and whether it embeds and/or projects."""

    def __init__(self, loaded: Loaded) -> None:
        self.model = loaded.model
        self.shard = loaded.shard
        self.inner = find_layers_owner(loaded.model)
        if not self.shard.last:
            # Non-last ranks hand on the hidden state before the final norm.
            for name in NORM_NAMES:
                if isinstance(self.inner.get(name), nn.Module):
                    setattr(self.inner, name, nn.Identity())
                    break

    def forward(self, tokens: mx.array | None, h: mx.array | None, cache: list[Any],
                length: int) -> mx.array:
        """First rank: from tokens. Others: from the previous rank's hidden state `h`.
        Returns the hidden state for the next rank, or the last position's logits."""
        inputs = tokens if tokens is not None else mx.zeros((1, length), dtype=mx.int32)
        if self.shard.last:
            return _call(self.model, inputs, cache, h)[:, -1:, :]
        return _call(self.inner, inputs, cache, h)


class LeaderModel:
    """What rank 0 hands to mlx-lm's generation code in place of the model."""

    def __init__(self, loaded: Loaded, group: Group, parallelism: str) -> None:
        self.loaded = loaded
        self.group = group
        self.parallelism = parallelism
        self.stage = Stage(loaded) if parallelism == "pipeline" else None
        self._ids = itertools.count(1)
        self._freed: list[int] = []  # caches whose generation ended, announced with the next header
        self.layers = loaded.model.layers  # mlx-lm checks len(layers) against the cache
        self.vocab = int(loaded.model.args.vocab_size)
        self.dtype = _compute_dtype(loaded.model)

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
        if self.parallelism == "tensor":
            tokens = inputs.astype(mx.int32)
            for dst in range(1, g.size):
                g.send(tokens, dst)
            logits = self.loaded.model(inputs, cache=cache)[:, -1:, :]
            g.compute(logits, length)
            return logits
        assert self.stage is not None
        h = self.stage.forward(inputs, None, cache, length)
        g.send(h, 1, length)  # evaluates this rank's stage too
        return g.recv((1, 1, self.vocab), self.dtype, g.size - 1, length)

    def heartbeat(self) -> None:
        self._flush_freed()
        self.group.send_header(Cmd.HEARTBEAT)
        self.group.barrier()

    def shutdown(self) -> None:
        self.group.send_header(Cmd.SHUTDOWN)
        self.group.barrier()  # so no peer sees a closed socket before everyone is done


def worker_loop(loaded: Loaded, group: Group, parallelism: str, life: Lifecycle) -> None:
    """Ranks 1..N-1: follow rank 0's headers until SHUTDOWN (clean) or the group breaks."""
    stage = Stage(loaded) if parallelism == "pipeline" else None
    model = loaded.model
    caches: dict[int, list[Any]] = {}
    hidden = int(model.args.hidden_size)
    dtype = _compute_dtype(model)
    while True:
        # Idle here is interruptible: a stop request waits briefly for rank 0's SHUTDOWN (the
        # usual case: the daemon asks every rank at once), then leaves anyway.
        with life.interruptible(grace=2.0):
            cmd, cache_id, length = group.recv_header()
        if cmd is Cmd.FORWARD:
            cache = caches.get(cache_id)
            if cache is None:  # should not happen; a fresh cache keeps the group in step
                cache = caches[cache_id] = _new_cache(model)
            if stage is None:
                tokens = group.recv((1, length), mx.int32, 0)
                group.compute(model(tokens, cache=cache), length)
                continue
            h = group.recv((1, length, hidden), dtype, group.rank - 1, length)
            out = stage.forward(None, h, cache, length)
            group.send(out, 0 if stage.shard.last else group.rank + 1, length)
        elif cmd is Cmd.NEW_CACHE:
            caches[cache_id] = _new_cache(model)
        elif cmd is Cmd.FREE_CACHE:
            caches.pop(cache_id, None)
        elif cmd is Cmd.HEARTBEAT:
            group.barrier()
        elif cmd is Cmd.SHUTDOWN:
            group.barrier()
            return


def _new_cache(model: nn.Module) -> list[Any]:
    """A KV cache per layer this rank holds (a pipeline rank's model keeps only its own)."""
    from mlx_lm.models.cache import make_prompt_cache

    return list(make_prompt_cache(model))


def _compute_dtype(model: nn.Module) -> mx.Dtype:
    """The dtype hidden states travel in: that of the layers' weights."""
    for _, a in flat_arrays(model.layers[0].parameters()):
        if mx.issubdtype(a.dtype, mx.floating):
            return a.dtype
    return mx.float32

