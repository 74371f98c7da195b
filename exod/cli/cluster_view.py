"""`exoctl cluster` as a table, and the lines `exod check` prints of what this node announces
(the JSON forms are the stable interface; these are for eyes)."""

from __future__ import annotations

from exod.core.nodes import NodeInfo
from exod.core.sizes import format_size
from exod.wire import control_status as cs


def describe_node(info: NodeInfo) -> list[str]:
    """What a node announces, a line a figure."""
    models = ", ".join(f"{m.name}@{m.revision[:8]}" if m.revision else m.name
                       for m in info.models) or "none"
    return [
        f"  node id: {info.node_id} (name {info.name})",
        f"  backend: {info.backend}",
        f"  memory: {format_size(info.memory_total)} total, {format_size(info.memory_usable)} "
        "usable by exod",
        f"  disk free for models: {format_size(info.disk_free)}",
        f"  models: {models}",
        f"  addresses: {', '.join(info.addresses) or 'none'}",
        f"  ports: api {info.api_port or '-'}, cluster {info.control_port or '-'}",
    ]


def _ago(seconds: float) -> str:
    return f"{seconds:.0f}s ago" if seconds >= 1 else "now"


def render_cluster(c: cs.ClusterStatus | None) -> str:
    if c is None:
        return ("this node is in no cluster (set cluster.key_file, and cluster.announce true: "
                "see docs/cluster.md)")
    me = c.announced
    head = (f"cluster {c.cluster_id}: this node {me.name} ({me.node_id}) on {c.listen}, "
            f"mDNS {'on' if c.mdns else 'off'}, {len(c.peers)} seed peer(s)")
    rows = [("NODE", "STATE", "LAST HEARD", "BACKEND", "MEMORY", "DISK", "MODELS", "ADDRESSES")]
    rows.append((f"{me.name} ({me.node_id})", "this node", "-", me.backend,
                 f"{format_size(me.memory_usable)}/{format_size(me.memory_total)}",
                 format_size(me.disk_free), str(len(me.models)), ", ".join(me.addresses)))
    for n in c.nodes:
        i = n.info
        if i is None:
            who = n.node_id if n.node_id != "?" else "(unnamed)"
            rows.append((who, "foreign", _ago(n.last_heard_s), "-", "-", "-", "-",
                         f"{n.address}: {n.reason} (x{n.refusals})"))
            continue
        rows.append((f"{n.name} ({n.node_id})", n.state, _ago(n.last_heard_s), i.backend,
                     f"{format_size(i.memory_usable)}/{format_size(i.memory_total)}",
                     format_size(i.disk_free), str(len(i.models)), ", ".join(i.addresses)))
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]) - 1)]
    lines = [head, ""]
    lines += ["  ".join(col.ljust(w) for col, w in zip(r, widths, strict=False)) + "  " + r[-1]
              for r in rows]
    names = {me.node_id: me.name} | {n.node_id: n.name for n in c.nodes if n.info is not None}
    if c.links:
        lines += ["", "LINKS (measured by the first node)"]
        lines += [f"  {names.get(link.a, link.a)} -> {names.get(link.b, link.b)}: "
                  f"{link.seconds_per_mib * 1000:.1f} ms/MiB" for link in c.links]
    if c.error:
        lines += ["", f"error: {c.error}"]
    return "\n".join(line.rstrip() for line in lines)
