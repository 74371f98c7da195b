"""Status snapshots: what `exoctl status` shows (typed: exod.wire.control_status), and the one-line
summary that goes to the service manager's STATUS=. Built on demand from the runtimes; nothing
is cached."""

from __future__ import annotations

from exod.wire import control_status as cs
from exod.core.durations import format_duration
from exod.wire.messages import Phase, ServingReport
from exod.core.states import State
from exod.daemon.instance import InstanceRuntime
from exod.daemon.rank import RankRuntime
from exod.daemon.procinfo import rss_bytes


def stalled_for(rank: RankRuntime, now: float, stall_after: float) -> float | None:
    """Seconds without progress while loading, once past `stall_after`; purely informative."""
    if rank.state is not State.LOADING and rank.state is not State.STARTING:
        return None
    last = rank.last_progress if rank.last_progress is not None else rank.started_at
    if last is None or now - last < stall_after:
        return None
    return now - last


def detail(inst: InstanceRuntime, now: float, stall_after: float) -> str:
    """e.g. `loading 17/80 (no progress for 4m)`, `failed: exit code 65: ...`, `ready`,
    `hung (no progress for 5m); stopping (SIGKILL in 20s if still running)`."""
    text = _detail(inst, now, stall_after)
    if inst.hung and inst.state in (State.STOPPING, State.BACKOFF):
        return f"{inst.hung}; {text}"
    if inst.config.on_demand and inst.state is State.STOPPED:
        return "stopped (starts on demand)"
    return text


def _detail(inst: InstanceRuntime, now: float, stall_after: float) -> str:
    state = inst.state
    if not inst.group.has_local_ranks:
        return "remote: every rank runs on another host"
    if state is State.DOWNLOADING:
        return inst.download.describe(now) if inst.download is not None else "downloading"
    if state in (State.STARTING, State.LOADING):
        local = [r for r in inst.ranks if r.local]
        done = sum(r.layers_loaded for r in local)
        total = sum(r.layers_total for r in local)
        text = f"{state} {done}/{total}" if state is State.LOADING else str(state)
        # e.g. "importing mlx", "connecting to 1 peer (attempt 3)", "waiting for the other 1
        # rank(s) to load": what a start waits for before (or after) its layers
        waiting = next((r.status_text for r in local if r.phase in (
            Phase.STARTING, Phase.CONNECTING, Phase.WAITING) and r.status_text), "")
        if waiting:
            text += f" ({waiting})"
        stalls = [s for r in inst.ranks if (s := stalled_for(r, now, stall_after)) is not None]
        if stalls:
            text += f" (no progress for {format_duration(max(stalls))})"
        return text
    if state in (State.FAILED, State.BACKOFF) and inst.machine.reason:
        return f"{state}: {inst.machine.reason}"
    if state is State.STOPPING:
        kill = [r.ladder.time_to_kill(now) for r in inst.ranks if r.ladder is not None]
        if kill:  # what an operator waiting on a stop wants to know
            soonest = min(kill)
            return ("stopping (SIGKILL being sent)" if soonest == 0 else
                    f"stopping (SIGKILL in {format_duration(soonest)} if still running)")
    return str(state)


def rank_status(rank: RankRuntime, now: float, stall_after: float) -> cs.RankStatus:
    stall = stalled_for(rank, now, stall_after)
    exit_ = rank.last_exit
    return cs.RankStatus(
        rank=rank.rank,
        host=rank.host,
        remote=not rank.local,
        pid=rank.pid,
        state=rank.state,
        layers=[rank.shard.start, rank.shard.end],
        layers_loaded=rank.layers_loaded,
        layers_total=rank.layers_total,
        rss_bytes=rss_bytes(rank.pid) if rank.pid is not None else None,
        uptime_s=round(now - rank.started_at, 3) if rank.pid and rank.started_at else None,
        last_exit=cs.ExitStatus(exit_.code, exit_.signal, str(exit_)) if exit_ else None,
        status=rank.status_text if rank.local else f"remote: run by exod on {rank.host}",
        phase=rank.phase.value if rank.phase is not None and rank.local else None,
        error=rank.error or None,
        no_progress_s=round(stall, 1) if stall is not None else None,
        # Serving runners send a heartbeat from their main loop every few seconds.
        heartbeat_age_s=(round(now - rank.last_heartbeat, 1)
                         if rank.last_heartbeat is not None else None),
        ladder=(cs.LadderStatus(rank.ladder.current.value,
                                round(rank.ladder.time_to_kill(now), 1))
                if rank.ladder is not None else None),
    )


def serving_status(s: ServingReport | None) -> cs.ServingStatus | None:
    """How the serving rank serves, as its runner last reported (None before that), with the
    prompt cache's hit rate (hits per lookup)."""
    if s is None:
        return None
    if s.batches:
        return cs.ServingStatus(s.batching, s.width, s.active, s.prefill_step,
                                batches=cs.BatchStatus(s.batches, s.batched_inputs,
                                                       round(s.batched_inputs / s.batches, 2)))
    if s.batching != "continuous":
        return cs.ServingStatus(s.batching, s.width, s.active, speculative=speculative(s))
    rate = round(s.cache_hits / s.cache_lookups, 4) if s.cache_lookups else None
    return cs.ServingStatus(s.batching, s.width, s.active, s.prefill_step, cs.PromptCacheStatus(
        entries=s.cache_entries, bytes=s.cache_bytes, max_bytes=s.cache_max_bytes,
        lookups=s.cache_lookups, hits=s.cache_hits, hit_rate=rate,
        cached_tokens=s.cached_tokens, prompt_tokens=s.prompt_tokens, disk=disk_status(s),
        shared_hits=s.shared_hits, shared_tokens=s.shared_tokens),
        speculative(s))


def disk_status(s: ServingReport) -> cs.DiskCacheStatus | None:
    """The disk tier's figures (its hit rate per lookup), or None without a disk tier."""
    if not s.disk_max_bytes:
        return None
    rate = round(s.disk_hits / s.cache_lookups, 4) if s.cache_lookups else None
    return cs.DiskCacheStatus(
        state=s.disk_state, entries=s.disk_entries, bytes=s.disk_bytes,
        max_bytes=s.disk_max_bytes, hits=s.disk_hits, hit_rate=rate,
        cached_tokens=s.disk_cached_tokens, load_s=round(s.disk_load_ms / 1000, 3),
        writes=s.disk_writes, errors=s.disk_errors)


def speculative(s: ServingReport) -> cs.SpeculativeStatus | None:
    """A draft model's figures (accepted per drafted token), or None without one."""
    if not s.draft_tokens:
        return None
    rate = round(s.draft_accepted / s.drafted, 4) if s.drafted else None
    return cs.SpeculativeStatus(s.draft_tokens, s.drafted, s.draft_accepted, rate)


def instance_status(inst: InstanceRuntime, now: float, stall_after: float) -> cs.InstanceStatus:
    c = inst.config
    active = inst.state.active
    return cs.InstanceStatus(
        name=inst.name,
        state=inst.state,
        detail=detail(inst, now, stall_after),
        reason=inst.machine.reason or None,
        since_s=round(now - inst.machine.since, 3),
        uptime_s=round(now - inst.started_at, 3) if active and inst.started_at else None,
        model=str(c.model),
        shards=c.shards,
        parallelism=c.parallelism,
        autostart=c.autostart,
        restart=c.restart,
        restarts=inst.tracker.restarts,
        source=c.source,
        # Rank 0 serves (the others follow it): its engine is the instance's.
        serving=serving_status(inst.ranks[0].serving) if inst.ranks else None,
        ranks=[rank_status(r, now, stall_after) for r in inst.ranks],
        hub=str(c.hub) if c.hub is not None else None,
        download=inst.download.status(now) if inst.download is not None else None,
    )


def summary(instances: list[InstanceRuntime], now: float, stall_after: float) -> str:
    """One line for STATUS=, e.g. `3/4 ready; big: loading 17/80`."""
    if not instances:
        return "no instances configured"
    ready = sum(1 for i in instances if i.state is State.READY)
    parts = [f"{ready}/{len(instances)} ready"]
    parts += [f"{i.name}: {detail(i, now, stall_after)}" for i in instances
              if i.state is not State.READY]
    return "; ".join(parts)
