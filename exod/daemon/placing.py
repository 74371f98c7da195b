"""Where this daemon runs the ranks of a `placement: auto` instance, and what its model costs.

Until nodes find each other, the only member is this host (`this_node`): an auto instance runs
every rank here, in as many ranks as `shards` says (one for `auto`), each holding the layers
the planner gives it (sized by their bytes, not an even split). A plan that does not fit this
host still runs with the planner's split; memory admission then refuses its start with its own
figures. The seam for a cluster is `members()`: the nodes and links the planner is given, this
host alone until discovery's membership is read there; a plan across hosts then needs the
group's addresses agreed (hosts, port_base), as `exod plan --write` writes them.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
from collections.abc import Callable, Iterable

from exod.config.schema import Instance
from exod.core.memory import HeaderError, KvSpec, model_tensors
from exod.core.nodes import Link, NodeInfo
from exod.core.placement import ModelCosts, Placement, PlacementRefused, model_costs, place
from exod.core.shards import Shard, pipeline_shards, tensor_shards
from exod.daemon.procinfo import available_bytes
from exod.facts.model_dir import model_config
from exod.facts.vision import tower

Log = Callable[[str, str], None]  # (level, text)
THIS_BACKEND = "metal" if sys.platform == "darwin" else "cpu"  # as memory admission counts


def this_node(name: str | None = None, headroom: int = 0) -> NodeInfo:
    """This host as the planner sees it: what memory admission would give a new instance now
    (`procinfo.available_bytes`), less `headroom`."""
    name = name or socket.gethostname()
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError, AttributeError):
        total = 0
    try:
        available = available_bytes()
    except ValueError:  # a bad EXOD_MEMORY_AVAILABLE: admission says so at the start
        available = None
    usable = max(0, (available if available is not None else total) - headroom)
    return NodeInfo(node_id=name, name=name, backend=THIS_BACKEND, memory_total=total,
                    memory_usable=usable, disk_free=0)


def members(here: NodeInfo) -> tuple[list[NodeInfo], list[Link]]:
    """The nodes and links an auto instance is placed on: this host alone, for now."""
    return [here], []


def costs(inst: Instance, backends: Iterable[str]) -> dict[str, ModelCosts]:
    """What the instance's model costs a rank on each backend, from its safetensors headers
    (raises HeaderError or OSError)."""
    tensors = model_tensors(inst.model)
    config = model_config(inst.model)
    draft = None
    if inst.draft_model is not None and inst.draft_model.is_dir():
        draft = (model_tensors(inst.draft_model), model_config(inst.draft_model))
    kv = KvSpec(inst.kv_bits, inst.kv_group_size, inst.quantized_kv_start, inst.max_kv_size)
    sight = tower(inst.model)
    return {b: model_costs(tensors, config, inst.dtype, b == "cpu", inst.max_concurrency or 1,
                           inst.context_tokens, kv, draft, sight) for b in sorted(set(backends))}


def plan(inst: Instance, nodes: list[NodeInfo], links: Iterable[Link] = ()) -> Placement:
    """The planner's placement of `inst` (raises PlacementRefused, HeaderError, OSError)."""
    return place(inst.name, inst.parallelism, inst.shards,
                 costs(inst, (n.backend for n in nodes)), nodes, links)


def local_shards(inst: Instance, total: int, log: Log | None = None) -> list[Shard]:
    """The shards of an auto instance whose ranks all run on this host; `log(level, text)`
    hears what was decided (the daemon's log; `exod check` and `exod plan` say it their way)."""
    log = log or (lambda level, text: None)
    here = this_node()
    nodes, links = members(here)
    try:
        try:
            placed = plan(inst, nodes, links)
        except PlacementRefused as e:
            log("WARNING", f"{e}; its ranks are split as if it fit (memory admission decides)")
            roomy = [dataclasses.replace(n, memory_usable=2**62) for n in nodes]
            placed = plan(inst, roomy, links)
    except (HeaderError, OSError) as e:
        world = max(1, inst.shards)
        log("WARNING", f"no layer sizes ({e}): {world} rank{'s' if world > 1 else ''} split "
                       "evenly")
        return (tensor_shards(total, world) if inst.parallelism == "tensor"
                else pipeline_shards(total, min(world, total)))
    if placed.world > 1 and placed.parallelism == "pipeline":
        log("INFO", f"placement: {placed.world} ranks on this host, layers "
                    f"{list(placed.counts())} (by their bytes)")
    return placed.shards()


def placed_config(inst: Instance, shards: list[Shard]) -> Instance:
    """An auto instance as the rest of the daemon reads it: its number of ranks decided."""
    if inst.placement != "auto" or inst.shards == len(shards):
        return inst
    return dataclasses.replace(inst, shards=len(shards))

