"""`exod check`'s lines for models named by hub repository: cached or not, the size, and whether
it fits in memory and on disk. Nothing is downloaded: a model not in the cache is looked up by
the fetcher, asked for a plan (`exod.wire.specs.PlanAsk`: file sizes only), unless exod is
offline."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from exod.wire import messages as m
from exod.wire.ask import NoAnswer, ask
from exod.config.schema import Config, Instance
from exod.core.memory import RUNTIME_BYTES
from exod.hub import cache as hub_cache
from exod.core.sizes import format_size
from exod.hub.files import disk_problem
from exod.core.hub_ref import HubRef
from exod.wire.specs import PlanAsk, Planned

PLAN_TIMEOUT = 120.0


def cache_of(cfg: Config) -> Path:
    return cfg.hub.cache or hub_cache.default_cache(os.environ, os.geteuid())


def offline(cfg: Config) -> bool:
    return cfg.hub.offline or os.environ.get("HF_HUB_OFFLINE", "").lower() in (
        "1", "true", "yes", "on")


def plan(cfg: Config, ref: HubRef) -> Planned | str:
    """What fetching `ref` would take, or why it cannot be told (one line)."""
    question = PlanAsk(version=m.VERSION, ref=ref, cache=cache_of(cfg), commit=None,
                       offline=False, token_file=cfg.hub.hf_token_file, peers=(),
                       cluster_key_file=None)
    try:
        answer: Planned | m.Failed = ask(
            "exod.hub", question, {Planned.type: Planned, m.Failed.type: m.Failed},
            PLAN_TIMEOUT, meanwhile={m.Status.type: m.Status})
    except NoAnswer as e:
        return f"cannot look it up: {e}"
    return answer.reason if isinstance(answer, m.Failed) else answer


def memory_text(cfg: Config, weights: int) -> str:
    """Before the files are here, the weights as stored are the floor of what a rank needs
    (the full estimate, with dtype and KV cache, is made from the headers once fetched)."""
    from exod.daemon.procinfo import available_bytes

    available = available_bytes(0)
    if available is None:
        return "memory is estimated once fetched"
    free = available - cfg.defaults.memory_headroom
    verdict = "fit" if weights + RUNTIME_BYTES <= free else "do NOT fit"
    return (f"its files ({format_size(weights)}) {verdict} in the memory available now "
            f"({format_size(max(0, free))}); the full estimate is made once fetched")


def lines(cfg: Config) -> tuple[list[str], list[Instance]]:
    """The lines, and the instances to estimate memory for (cached ones, at their snapshot;
    a draft model named on the hub counts once it is cached)."""
    out: list[str] = []
    estimate: list[Instance] = []
    cache = cache_of(cfg)
    for inst in cfg.instances.values():
        if inst.draft_hub is not None:
            line, found = ref_line(cfg, cache, f"{inst.name}: draft_model", inst.draft_hub)
            out.append(line)
            if found is not None:
                inst = dataclasses.replace(inst, draft_model=found.path)
        if inst.hub is None:
            estimate.append(inst)
            continue
        line, found = ref_line(cfg, cache, inst.name, inst.hub)
        out.append(line)
        if found is not None:
            estimate.append(dataclasses.replace(inst, model=found.path))
    return out, estimate


def ref_line(cfg: Config, cache: Path, label: str, ref: HubRef
             ) -> tuple[str, hub_cache.Cached | None]:
    """What `exod check` says of one repository, and its snapshot when cached."""
    found = hub_cache.cached(cache, ref)
    if found is not None:
        return (f"{label}: {ref}: cached ({format_size(found.size)}, commit "
                f"{found.commit[:12]}) in {cache}", found)
    if offline(cfg):
        return (f"{label}: {ref}: not in the cache at {cache}; exod is offline, so it will "
                "not start", None)
    p = plan(cfg, ref)
    if isinstance(p, str):
        return f"{label}: {ref}: not in the cache at {cache}; {p}", None
    fits = disk_problem(str(ref), p.missing, p.free, str(cache))
    return (f"{label}: {ref}: not in the cache; fetched at its first start: "
            f"{format_size(p.size)} (commit {p.commit[:12]}), "
            + (fits or f"fits on disk ({format_size(p.free)} free)")
            + "; " + memory_text(cfg, p.size), None)
