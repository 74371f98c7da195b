"""`exod plan --nodes FILE`: the nodes (and links) to place on, as JSON.

Either a list of nodes, or `{"nodes": [...], "links": [...]}`. A node has NodeInfo's fields
(exod.core.nodes): `node_id`, `name`, `backend` (metal, cuda or cpu), `memory_usable` (bytes,
or a size such as "24GiB"); `memory_total` and `disk_free` (default 0), `addresses` (a list)
and `models` (a list of `{"name", "revision"}`) may be left out. A link is `{"a", "b",
"seconds_per_mib"}`. Every problem is a one-line ValueError naming the entry.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, get_args

from exod.core.nodes import Backend, Link, NodeInfo, NodeModel
from exod.core.sizes import parse_size

_SIZES = ("memory_total", "memory_usable", "disk_free")
_OPTIONAL = {"memory_total": 0, "disk_free": 0}


def read_nodes(path: Path) -> tuple[list[NodeInfo], list[Link]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot read: {e}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON: {e}") from None
    if isinstance(data, list):
        data = {"nodes": data}
    if not isinstance(data, dict) or set(data) - {"nodes", "links"}:
        raise ValueError(f"{path}: expected a list of nodes, or {{\"nodes\": [...], "
                         "\"links\": [...]}")
    nodes = [_node(item, f"{path}: nodes[{i}]") for i, item in enumerate(_list(data, "nodes"))]
    ids = [n.node_id for n in nodes]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: a node_id is given twice")
    if not nodes:
        raise ValueError(f"{path}: no node")
    links = [_link(item, f"{path}: links[{i}]", set(ids))
             for i, item in enumerate(_list(data, "links"))]
    return nodes, links


def _list(data: dict[str, Any], key: str) -> list[Any]:
    value = data.get(key, [])
    if not isinstance(value, list):
        raise ValueError(f"`{key}` must be a list")
    return value


def _node(item: object, where: str) -> NodeInfo:
    if not isinstance(item, dict):
        raise ValueError(f"{where}: expected an object")
    known = {f.name for f in dataclasses.fields(NodeInfo)}
    if unknown := sorted(set(item) - known):
        raise ValueError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")
    values = {**_OPTIONAL, **item}
    for key in ("node_id", "name", "backend", "memory_usable"):
        if key not in values:
            raise ValueError(f"{where}: `{key}` is missing")
    for key in ("node_id", "name"):
        if not isinstance(values[key], str) or not values[key]:
            raise ValueError(f"{where}: `{key}` must be a non-empty string")
    if values["backend"] not in get_args(Backend):
        raise ValueError(f"{where}: `backend` must be one of {', '.join(get_args(Backend))}")
    try:
        for key in _SIZES:
            values[key] = parse_size(values[key])
        values["models"] = tuple(NodeModel(**m) for m in values.get("models", ()))
        values["addresses"] = tuple(str(a) for a in values.get("addresses", ()))
        return NodeInfo(**values)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from None


def _link(item: object, where: str, ids: set[str]) -> Link:
    if not isinstance(item, dict) or set(item) != {"a", "b", "seconds_per_mib"}:
        raise ValueError(f"{where}: expected {{\"a\", \"b\", \"seconds_per_mib\"}}")
    if item["a"] not in ids or item["b"] not in ids:
        raise ValueError(f"{where}: names a node that is not in the list")
    speed = item["seconds_per_mib"]
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or speed < 0:
        raise ValueError(f"{where}: `seconds_per_mib` must be a number, 0 or more")
    return Link(item["a"], item["b"], float(speed))
