"""Checks that span several fields of an instance, or several instances.

They are pure functions of validated `Instance`s and return `Issue`s keyed relative to the
instance ("shards", "layers[1]"); the loader turns those into positioned `Problem`s. Keeping them
free of YAML makes each easy to lift or reuse (e.g. by `exod check` on a running config).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from exod.config.model import model_layer_count
from exod.config.schema import Instance


@dataclass(frozen=True)
class Issue:
    key: str  # relative to the instance: "shards", "layers[1]", "port_base"
    message: str


def check_sharding(instance: Instance) -> list[Issue]:
    """Refuse multi-rank instances until sharding lands; delete this check then."""
    if instance.shards > 1:
        return [Issue("shards", f"{instance.shards}: multi-rank instances are not yet supported "
                                "(coming with sharding support); use shards: 1")]
    return []


def check_layout(instance: Instance, written: Collection[str]) -> list[Issue]:
    """`layers`, `hosts` and `port_base` agree with `shards` (and with the model's layer count).

    written: the keys the operator wrote, since a default `hosts: ()` and `hosts: []` look alike.
    """
    issues: list[Issue] = []
    shards = instance.shards
    if instance.layers is not None:
        if len(instance.layers) != shards:
            issues.append(Issue("layers", f"has {len(instance.layers)} entries but shards is "
                                          f"{shards}: give one layer count per rank"))
        bad = [i for i, n in enumerate(instance.layers) if n < 1]
        issues += [Issue(f"layers[{i}]", f"must be at least 1, got {instance.layers[i]}")
                   for i in bad]
        total = model_layer_count(instance.model)
        if not bad and total is not None and sum(instance.layers) != total:
            issues.append(Issue("layers", f"adds up to {sum(instance.layers)} but the model has "
                                          f"{total} layers"))
    if "hosts" in written:
        if not instance.hosts:
            issues.append(Issue("hosts", "is empty: list one host per rank, or leave `hosts` out "
                                         "to run every rank on this host"))
        elif len(instance.hosts) != shards:
            issues.append(Issue("hosts", f"lists {len(instance.hosts)} hosts but shards is "
                                         f"{shards}: give one host per rank"))
    if instance.port_base is not None and instance.port_base + shards - 1 > 65535:
        issues.append(Issue("port_base",
                            f"{instance.port_base} + {shards} ranks goes past port 65535"))
    return issues


def check_ports(instances: Sequence[Instance]) -> list[tuple[Instance, Issue]]:
    """Port ranges [port_base, port_base + shards) of different instances must not overlap."""
    ranged = sorted((i for i in instances if i.port_base is not None),
                    key=lambda i: (i.port_base or 0, i.name))
    found: list[tuple[Instance, Issue]] = []
    for k, later in enumerate(ranged):
        assert later.port_base is not None
        for earlier in ranged[:k]:
            assert earlier.port_base is not None
            if later.port_base < earlier.port_base + earlier.shards:
                found.append((later, Issue(
                    "port_base",
                    f"ports {_span(later)} overlap those of instance {earlier.name!r} "
                    f"({_span(earlier)}, defined at {earlier.source})",
                )))
    return found


def _span(instance: Instance) -> str:
    first = instance.port_base or 0
    last = first + instance.shards - 1
    return str(first) if last == first else f"{first}-{last}"
