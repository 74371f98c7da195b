"""Where a model keeps its transformer blocks, whatever the family.

mlx-lm models expose `model.layers`, but that is often not the list itself: a property
forwarding to `model.model.layers`, a fresh slice on every access (`pipeline_layers` in the
families that mix in mlx-lm's PipelineMixin), or a path through a `language_model` wrapper
(multimodal checkpoints served as text). To change which blocks a rank runs we need the module
that really holds the list, found by identity of the blocks, not by the list object.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import mlx.core as mx
from mlx import nn
from mlx.utils import tree_flatten


class NoBlocks(Exception):
    """The model has no list of blocks that exod can split."""


@dataclass
class Blocks:
    owner: nn.Module  # the module whose `layers` entry is the list
    key: str  # the attribute name of the list in `owner`

    @property
    def items(self) -> list[nn.Module]:
        blocks: list[nn.Module] = self.owner[self.key]
        return blocks

    def replace(self, index: int, module: nn.Module) -> None:
        """In place: every view (slices taken later, properties) sees the change."""
        self.items[index] = module


def find_blocks(model: nn.Module) -> Blocks:
    """The list of blocks `model.layers` shows, and the module that owns it."""
    try:
        shown = model.layers
    except AttributeError:
        shown = None
    if not isinstance(shown, (list, tuple)) or not shown:
        raise NoBlocks(f"{type(model).__module__} has no list of layers")
    wanted = [id(b) for b in shown]
    parts: list[str] = []  # lists holding some of the blocks, when no one list holds all
    stack: list[tuple[str, nn.Module]] = [("", model)]
    seen: set[int] = set()
    while stack:
        path, m = stack.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        for key, value in m.items():  # nn.Module is a dict of its children
            if isinstance(value, list):
                ids = [id(b) for b in value]
                if ids == wanted:
                    return Blocks(m, key)
                if ids and set(ids) <= set(wanted):
                    parts.append(path + key)
                stack.extend((f"{path}{key}.{i}.", v) for i, v in enumerate(value)
                             if isinstance(v, nn.Module))
            elif isinstance(value, nn.Module):
                stack.append((f"{path}{key}.", value))
    name = type(model).__module__
    if len(parts) > 1:
        raise NoBlocks(f"{name}: its layers are joined from several lists "
                       f"({', '.join(sorted(parts))}); exod splits a single list only")
    raise NoBlocks(f"{name}: could not find the module that owns its layers")


def flat_arrays(tree: Any) -> list[tuple[str, mx.array]]:
    """tree_flatten of a parameter tree, typed: mlx types the result as a list or a dict (the
    dict only when given one as `destination`)."""
    return cast("list[tuple[str, mx.array]]", tree_flatten(tree))
