"""`model:` naming a hub repository: `hf:ORG/NAME[@REVISION]` or `{repo: ORG/NAME, revision: R}`.

The instance's `model` then holds the name (`hf:ORG/NAME`) as a placeholder path, and `hub` the
parsed reference; the daemon finds the snapshot in the cache (or fetches it) at each start.
"""

from __future__ import annotations

from pathlib import Path

from exod.config.errors import Mark
from exod.config.yamlpos import MapNode, Node, Scalar, describe
from exod.core import hub_ref
from exod.core.hub_ref import HubRef

Problem = tuple[Mark, str, str]  # where, key path, message


def names_hub(node: Node) -> bool:
    """The value of `model:` names a hub repository (rather than a directory)."""
    if isinstance(node, MapNode):
        return True
    return isinstance(node, Scalar) and isinstance(node.value, str) and \
        hub_ref.is_hub_name(node.value)


def parse_model(node: Node, path: str) -> tuple[HubRef | None, list[Problem]]:
    if isinstance(node, Scalar):
        try:
            return hub_ref.parse(str(node.value)), []
        except ValueError as e:
            return None, [(node.mark, path, str(e))]
    assert isinstance(node, MapNode)
    problems: list[Problem] = []
    values: dict[str, str] = {}
    for key, entry in node.entries.items():
        sub = f"{path}.{key}"
        if key not in ("repo", "revision"):
            problems.append((entry.key_mark, sub, f"unknown key {key!r} (a hub model takes "
                                                  "`repo:` and `revision:`)"))
        elif not isinstance(entry.value, Scalar) or not isinstance(entry.value.value, str):
            problems.append((entry.value.mark, sub,
                             f"expected a string, got {describe(entry.value)}"))
        else:
            values[key] = entry.value.value
    if "repo" not in node.entries:
        problems.append((node.mark, path, "missing required key 'repo' (ORG/NAME on the hub)"))
    if problems:
        return None, problems
    try:
        return hub_ref.make(values["repo"].removeprefix(hub_ref.PREFIX),
                            values.get("revision", hub_ref.DEFAULT_REVISION)), []
    except ValueError as e:
        return None, [(node.mark, path, str(e))]


def placeholder(ref: HubRef) -> Path:
    """What `Instance.model` holds for a hub model: its name, never an existing directory."""
    return Path(str(ref))
