"""`exod plan --write`: a placement as the explicit keys the config already knows (`shards`,
`layers`, `hosts`, `port_base`), in a file of `instances:` that a config can include, or whose
instances replace their `placement: auto` definitions.

Each instance keeps the keys its operator wrote, as written, but for `placement` and what the
planner chose; its paths are written whole (a relative one meant the folder of the file that
held it). Every rank on this host (`node.name`): no `hosts`. Ranks on other hosts: `hosts`;
on several, also a `port_base` (the instance's own, else the first range from PORTS_FROM up
that no other instance's covers) and the cluster's key as `cluster_key_file` where the instance
names none.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from exod import __version__
from exod.config.checks import port_count
from exod.config.schema import Config, Instance
from exod.core.placement import Placement
from exod.core.sizes import format_size

PORTS_FROM = 20000  # below every kernel's ephemeral range (exod.core.ports)
CHOSEN = ("placement", "shards", "layers", "hosts", "port_base")


def written_keys(inst: Instance) -> dict[str, Any]:
    """The instance's mapping as its file holds it (anchors and merges expanded)."""
    file = inst.source.rsplit(":", 2)[0]
    data = yaml.safe_load(Path(file).read_text(encoding="utf-8"))
    body = data["instances"][inst.name]
    return dict(body) if isinstance(body, dict) else {}


def _whole_paths(inst: Instance, key: str, raw: object) -> object:
    hub = {"model": inst.hub, "draft_model": inst.draft_hub}
    if hub.get(key) is not None:
        return raw  # a hub name, as written
    value = getattr(inst, key, None)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple) and value and all(isinstance(v, Path) for v in value):
        return [str(v) for v in value]
    return raw


def explicit(cfg: Config, inst: Instance, placed: Placement,
             taken: list[range]) -> dict[str, Any]:
    """The instance's keys with the placement written out. `taken`: the port ranges already
    used (this one's is added)."""
    chosen: dict[str, Any] = {"shards": placed.world}
    if placed.parallelism == "pipeline" and placed.world > 1:
        chosen["layers"] = list(placed.counts())
    names = [s.node.name for s in placed.seats]
    if any(n != cfg.node.name for n in names):
        chosen["hosts"] = [{"name": s.node.name,
                            "address": s.node.addresses[0] if s.node.addresses else s.node.name}
                           for s in placed.seats]
    several = len(set(names)) > 1
    if inst.port_base is not None or several:
        base = inst.port_base or _free_base(placed.world + 1, taken)
        taken.append(range(base, base + placed.world + 1))
        chosen["port_base"] = base
    out: dict[str, Any] = {}
    for key, raw in written_keys(inst).items():
        if key in CHOSEN:
            out.update(chosen)
        else:
            out[key] = _whole_paths(inst, key, raw)
    out.update({k: v for k, v in chosen.items() if k not in out})
    if several and inst.cluster_key_file is None and cfg.cluster.key_file is not None:
        out["cluster_key_file"] = str(cfg.cluster.key_file)
    return out


def taken_ports(cfg: Config) -> list[range]:
    return [range(i.port_base, i.port_base + port_count(i)) for i in cfg.instances.values()
            if i.port_base is not None]


def _free_base(count: int, taken: list[range]) -> int:
    base = PORTS_FROM
    while clash := [r for r in taken if r.start < base + count and base < r.stop]:
        base = max(r.stop for r in clash)
    return base


def document(cfg: Config, instances: dict[str, dict[str, Any]], nodes_from: str,
             placements: list[Placement]) -> str:
    """The file: what it was planned from, then `instances:`."""
    seen = {n.node_id: n for p in placements for n in p.nodes()}
    lines = [f"# Written by `exod plan --write` (exod {__version__}) from {cfg.path},",
             f"# for the nodes of {nodes_from}:"]
    lines += [f"#   {n.name} ({n.node_id}): {n.backend}, {format_size(n.memory_usable)} usable"
              for n in seen.values()]
    lines.append("# Each exod runs the ranks whose host is its node.name (none: this host).")
    body = yaml.safe_dump({"instances": instances}, sort_keys=False, default_flow_style=None,
                          width=96)
    return "\n".join(lines) + "\n" + body
