"""The same serving loop on every rank of a group.

Every rank runs its own BatchEngine over `GroupModel` (exod.runner.group.group_model), whose
forward includes the group's communication and returns the same logits on every rank. Rank 0
serves: ServeLoop drives a `LeaderEngine`, which does each engine operation on rank 0's engine
and records it; before each step it sends the other ranks a plan (exod.runner.group.plan) of
the operations since the last one. The other ranks (`follow`) replay each plan on their own
engine and throw the events away, so the engines stay in step and every forward meets its
peers'. What a rank could decide differently is decided by rank 0 and carried in the plan: a
seed for a request without one, the prompt cache's entry count (the other ranks never evict by
their own bytes), the disk entry a prompt starts from (the engines then agree each step, by an
all-reduce, on when every rank has loaded its part, or that one cannot: a miss everywhere).
The rest is a function of the requests and the tokens. A rank whose step fails inside mlx can
no longer be sure it is in step, so the whole group restarts, as after a lost peer (exit 76).
docs/api.md, "Sharded instances".
"""

from __future__ import annotations

import dataclasses
import json
import secrets
from collections.abc import Callable
from typing import Any, Protocol

from exod.wire import messages as m
from exod.wire.options import GrammarLimits
from exod.wire.protocol import to_wire
import mlx.core as mx

from exod.runner.serving.batch_engine import BatchEngine, DiskChoice
from exod.runner.group import wire
from exod.runner.group.plan import (AbortAll, AbortPrefilling, Admit, CancelOp, ClearCacheOp, Op,
                                    Plan, See, Settings, Warm)
from exod.runner.link.lifecycle import Lifecycle
from exod.runner.link.log import ERR, log
from exod.runner.failures import PeerLost
from exod.runner.group.membership import Group
from exod.runner.serving.reading import Prompt
from exod.runner.prompt_cache.disk import DiskTier


class Replayed(Protocol):
    """What a group's engine offers besides the serve loop's interface (the text runner's
    BatchEngine; a model that sees: exod.runner.vision.engine.VisionEngine)."""

    width: int
    cache_bytes: int
    prefill_step: int
    failed_steps: int

    @property
    def active(self) -> int: ...

    @property
    def cache_entries(self) -> int: ...

    def read(self, req: m.Generate) -> Prompt: ...

    def admit(self, req: m.Generate, read: Prompt) -> DiskChoice | None: ...

    def cancel(self, rid: str) -> None: ...

    def expect(self, reading: int) -> bool: ...

    def step(self) -> list[m.Event]: ...

    def abort_all(self, code: m.ErrorCode, message: str) -> list[m.Event]: ...

    def abort_prefilling(self, code: m.ErrorCode, message: str) -> list[m.Event]: ...

    def serving(self) -> m.ServingReport: ...

    def follow_cache(self) -> None: ...

    def trim_cache(self, entries: int) -> None: ...

    # The prompt cache's disk tier and `warm:` prompts (a model that sees keeps neither:
    # exod.runner.serving.loop.NoPromptCache).
    @property
    def background(self) -> bool: ...

    def warm(self, tokens: list[int]) -> bool: ...

    def idle(self) -> None: ...

    def save_cache(self, deadline: float) -> None: ...

    def clear_cache(self) -> None: ...


class LeaderEngine:
    """Rank 0's engine: its own BatchEngine, each operation also recorded for the plan the
    other ranks replay (see exod.runner.serving.loop.Engine for the interface)."""

    def __init__(self, engine: Replayed, group: Group) -> None:
        self.engine = engine
        self.group = group
        self.pending = Plan(settings=Settings(engine.width, engine.cache_bytes,
                                              engine.prefill_step))
        self.size = 0  # bytes of the pending plan's operations, roughly

    @property
    def active(self) -> int:
        return self.engine.active

    def read(self, req: m.Generate) -> Prompt:
        # On the serve loop's reader thread: the loop goes on sending plans and heartbeats,
        # so the other ranks hear from rank 0 however long a prompt of megabytes takes. Only a
        # request rank 0 admits reaches them (to read again: it then fits the window).
        return self.engine.read(req)

    def admit(self, req: m.Generate, prompt: Prompt) -> None:
        req = seeded(req)
        disk = self.engine.admit(req, prompt)  # a RequestError leaves nothing to replay
        self._record(Admit(req, *(disk or (None, 0))))

    @property
    def background(self) -> bool:
        return self.engine.background

    def warm(self, tokens: list[int]) -> bool:
        if not self.engine.warm(tokens):
            return False
        self._record(Warm(tokens))
        return True

    def idle(self) -> None:
        self.engine.idle()

    def save_cache(self, deadline: float) -> None:
        self.engine.save_cache(deadline)

    def clear_cache(self) -> None:
        self.engine.clear_cache()
        self._record(ClearCacheOp())

    def cancel(self, rid: str) -> None:
        self.engine.cancel(rid)
        self._record(CancelOp(rid))

    def expect(self, reading: int) -> bool:
        return self.engine.expect(reading)

    def step(self) -> list[m.Event]:
        self.flush(step=True)
        failed = self.engine.failed_steps
        events = self.engine.step()
        if self.engine.failed_steps != failed:
            raise PeerLost("a batch step failed on rank 0 (see above); the group restarts to "
                           "be in step again")
        return events

    def abort_all(self, code: m.ErrorCode, message: str) -> list[m.Event]:
        self._record(AbortAll())
        return self.engine.abort_all(code, message)

    def abort_prefilling(self, code: m.ErrorCode, message: str) -> list[m.Event]:
        self._record(AbortPrefilling())
        return self.engine.abort_prefilling(code, message)

    def serving(self) -> m.ServingReport:
        return self.engine.serving()

    # ---- the group ---------------------------------------------------------------------------
    def flush(self, step: bool = False) -> None:
        """Send what the other ranks must replay (and whether to step): before each step,
        before a heartbeat, and when the operations pile up."""
        plan = self.pending
        if not plan.ops and not step and plan.settings is None:
            return
        plan.step, plan.keep = step, self.engine.cache_entries
        self.group.send(plan)
        self.pending, self.size = Plan(), 0

    def heartbeat(self) -> None:
        self.flush()
        self.group.send(wire.GroupHeartbeat())
        self.group.barrier()

    def shutdown(self) -> None:
        self.group.send(wire.GroupShutdown())
        self.group.barrier()  # so no peer sees a closed socket before everyone is done

    def _record(self, op: Op) -> None:
        cost = len(json.dumps(to_wire(op))) if isinstance(op, (Admit, See)) else 32
        if self.size + cost > wire.MAX_PAYLOAD // 2:  # a plan stays far below the workers' limit
            self.flush()
        self.pending.ops.append(op)
        self.size += cost


def agreement(group: Group) -> Callable[[list[bool]], list[bool]]:
    """For each flag, whether it holds on every rank: an all-reduce, at the same point of the
    same step on every rank (the engines' steps are the same)."""
    def agree(flags: list[bool]) -> list[bool]:
        total = group.all_sum(mx.array([int(f) for f in flags], dtype=mx.int32))
        counts: Any = total.tolist()
        return [int(n) == group.size for n in counts]
    return agree


def seeded(req: m.Generate) -> m.Generate:
    """A request with a seed: drawn on rank 0 when it has none, so every rank draws the same
    numbers."""
    return req if req.seed is not None else dataclasses.replace(req, seed=secrets.randbits(63))


def follow(model: Any, tokenizer: Any, group: Group, life: Lifecycle,
           grammar_limits: GrammarLimits | None = None,
           make: Callable[[Settings], Replayed] | None = None,
           make_disk: Callable[[], DiskTier | None] = lambda: None) -> Replayed | None:
    """Ranks 1..N-1: replay rank 0's plans until SHUTDOWN (clean) or the group breaks; the
    engine, once made (its prompt cache is written to disk at the stop). `make`: the engine
    for rank 0's settings (default: the text runner's BatchEngine, with its disk tier)."""
    engine: Replayed | None = None
    while True:
        if isinstance(engine, BatchEngine) and not engine.busy:
            engine.idle()  # rank 0's plans stopped coming: nothing in flight
        # Idle here is interruptible: a stop request waits briefly for rank 0's SHUTDOWN (the
        # usual case: the daemon asks every rank at once), then leaves anyway.
        with life.interruptible(grace=2.0):
            plan = group.recv()
        if isinstance(plan, wire.GroupHeartbeat):
            group.barrier()
            continue
        if isinstance(plan, wire.GroupShutdown):
            group.barrier()
            return engine
        if not isinstance(plan, Plan):
            raise PeerLost(f"rank 0 sent {plan.type} to a rank already serving")
        if engine is None:
            if plan.settings is None:
                raise PeerLost("rank 0's first plan has no engine settings")
            s = plan.settings
            engine = make(s) if make is not None else BatchEngine(
                model, tokenizer, width=s.width, cache_bytes=s.cache_bytes,
                prefill_step=s.prefill_step, grammar_limits=grammar_limits,
                disk=make_disk(), agree=agreement(group))
            engine.follow_cache()
        replay(engine, plan)


def replay(engine: Any, plan: Plan) -> None:
    """One plan on a worker's engine. Any failure means this rank is out of step: PeerLost
    (rank 0 then loses this peer too, and the whole group restarts)."""
    try:
        engine.trim_cache(plan.keep)
        for op in plan.ops:
            if isinstance(op, Admit):
                disk: DiskChoice | None = (op.disk_key, op.disk_tokens) if op.disk_key else None
                engine.admit(op.request, disk=disk)
            elif isinstance(op, See):  # a model that sees (exod.runner.vision.group)
                engine.see_shipped(op.request, op.tokens, op.pictures, op.width, op.dtype,
                                   {k: _array(v) for k, v in op.features.items()}, op.cached)
            elif isinstance(op, CancelOp):
                engine.cancel(op.id)
            elif isinstance(op, AbortPrefilling):
                engine.abort_prefilling("aborted", "")
            elif isinstance(op, Warm):
                engine.warm(op.tokens, force=True)
            elif isinstance(op, ClearCacheOp):
                engine.clear_cache()
            else:
                engine.abort_all("aborted", "")
        failed = engine.failed_steps
        if plan.step:
            engine.step()
    except Exception as e:  # noqa: BLE001 -- rank 0 admitted it; this rank cannot: out of step
        log(f"replaying rank 0's plan failed: {type(e).__name__}: {e}", ERR)
        raise PeerLost(f"out of step with rank 0 ({type(e).__name__}: {e})") from None
    if engine.failed_steps != failed:
        raise PeerLost("a batch step failed on this rank (see above); the group restarts")


def _array(ints: Any) -> Any:
    import mlx.core as mx

    return mx.array(ints.values, dtype=getattr(mx, ints.dtype)).reshape(ints.shape)
