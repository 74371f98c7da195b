"""Checks that span several fields of an instance, or several instances.

They are pure functions of validated `Instance`s and return `Issue`s keyed relative to the
instance ("shards", "layers[1]"); the loader turns those into positioned `Problem`s. Keeping them
free of YAML makes each easy to lift or reuse (e.g. by `exod check` on a running config).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from exod.core.durations import format_duration
from exod.core import names, request_rules
from exod.core.kinds import AUTO
from exod.facts.model_dir import model_heads, model_layer_count
from exod.facts.probe import layout_problem
from exod.config.schema import DEFAULT_CLUSTER_PORT, Cluster, Instance
from exod.secret_file import KEY_BYTES, secret_problem


@dataclass(frozen=True)
class Issue:
    key: str  # relative to the instance: "shards", "layers[1]", "port_base"
    message: str


def check_sharding(instance: Instance, node_name: str,
                   probe_layouts: bool = True) -> list[Issue]:
    """Every combination of shards, parallelism, model and hosts that cannot work, explained.
    Whether the model can be split so is asked of the runner's own code (exod.facts.probe)."""
    n = instance.shards
    if n <= 1:  # one rank, or `auto`: placed at the start (exod.daemon.placing)
        return []
    issues: list[Issue] = []
    total = model_layer_count(instance.model)
    if instance.parallelism == "pipeline":
        if total is not None and instance.layers is None and n > total:
            issues.append(Issue("shards", f"{n} ranks but the model has only {total} layers: "
                                          "a pipeline rank needs at least one layer"))
    elif instance.layers is not None:
        issues.append(Issue("layers", "tensor parallelism splits every layer, not layer "
                                      "ranges: remove `layers`"))
    elif (heads := model_heads(instance.model)) is not None and heads[1] % n:
        # What config.json already tells, without starting a probe.
        issues.append(Issue("parallelism", f"tensor over {n} ranks cannot work for this model: "
                                           f"its {heads[1]} attention heads do not split "
                                           f"across {n} ranks ({heads[0]} in config.json)"))
    if not issues and probe_layouts:
        why = layout_problem(instance.model, n, instance.parallelism, instance.layers)
        if why is not None:
            issues.append(Issue("parallelism" if instance.parallelism == "tensor" else "shards",
                                f"{instance.parallelism} over {n} ranks cannot work for this "
                                f"model: {why}"))
    if instance.backend == "mpi":
        issues.append(Issue("backend", "mpi: not supported yet: MPI forms its group only among "
                                       "ranks started by mpirun, and exod starts and supervises "
                                       "each rank itself; use ring"))
    hosts = {h.name for h in instance.hosts}
    if len(hosts) > 1 and instance.port_base is None:
        issues.append(Issue("port_base", "is required when ranks run on several hosts: every "
                                         "host must agree on the ports (rank r uses "
                                         "port_base + r)"))
    if len(hosts) > 1 and instance.cluster_key_file is None:
        issues.append(Issue("hosts", "ranks on several hosts need `cluster_key_file`: the same "
                                     "secret on every host, with which ranks prove they belong "
                                     "to the group (e.g. `openssl rand -hex 32 > FILE; chmod 600 "
                                     "FILE`, then copy it to each host)"))
    if instance.cluster_key_file is not None:
        problem = secret_problem(instance.cluster_key_file, KEY_BYTES)
        if problem:
            issues.append(Issue("cluster_key_file", problem))
    if instance.hosts and node_name not in hosts:
        issues.append(Issue("hosts", f"none is this host (node.name {node_name!r}): this daemon "
                                     "would run no rank of it"))
    return issues


def check_layout(instance: Instance, written: Collection[str]) -> list[Issue]:
    """`layers`, `hosts` and `port_base` agree with `shards` (and with the model's layer count).

    written: the keys the operator wrote, since a default `hosts: ()` and `hosts: []` look alike.
    """
    issues: list[Issue] = []
    shards = instance.shards
    if shards == AUTO:  # check_placement says what goes with it
        return issues
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
    if instance.port_base is not None and instance.port_base + port_count(instance) - 1 > 65535:
        issues.append(Issue("port_base",
                            f"{instance.port_base} + {port_count(instance)} ports goes past "
                            "port 65535"))
    return issues


def check_placement(instance: Instance, written: Collection[str]) -> list[Issue]:
    """`placement: auto` chooses the hosts and the layers: neither may be written beside it;
    and `shards: auto` means one rank per node the planner uses, so only with it."""
    if instance.placement != "auto":
        if instance.shards == AUTO:
            return [Issue("shards", "`auto` needs `placement: auto` (the planner chooses the "
                                    "number of ranks): write a number, or add "
                                    "`placement: auto`")]
        return []
    issues = [Issue(key, f"`{key}` and `placement: auto` cannot go together: placement auto "
                         f"chooses the {what} itself (remove `{key}`, or `placement`)")
              for key, what in (("hosts", "hosts"), ("layers", "layers of each rank"))
              if key in written]
    if instance.shards == AUTO and instance.port_base is not None:
        issues.append(Issue("port_base", "needs a number of `shards` (with `shards: auto` the "
                                         "number of ports is not known): write a number of "
                                         "shards, or leave `port_base` out"))
    return issues


def check_on_demand(instance: Instance, written: Collection[str]) -> list[Issue]:
    """Keys that only mean something for `autostart: on-demand`."""
    issues = [Issue(key, "applies only to `autostart: on-demand` instances (nothing would "
                         "start it again)")
              for key in ("idle_stop_after", "keep_alive")
              if key in written and not instance.on_demand]
    if "evictable" in written and not instance.on_demand:
        issues.append(Issue("evictable", "applies only to `autostart: on-demand` instances (no "
                                         "other instance is ever stopped for room)"))
    bounds = instance.keep_alive
    if bounds.min > bounds.max:
        issues.append(Issue("keep_alive", f"min ({format_duration(bounds.min)}) is more than "
                                          f"max ({format_duration(bounds.max)})"))
    return issues


def check_template_kwargs(instance: Instance) -> list[Issue]:
    """The instance's chat_template_kwargs pass the rule a request's own pass."""
    try:
        request_rules.chat_template_kwargs(dict(instance.chat_template_kwargs))
    except request_rules.RequestError as e:
        return [Issue("chat_template_kwargs", str(e).replace("`chat_template_kwargs`", "")
                      .lstrip(": ") or str(e))]
    return []


def check_warm(instance: Instance) -> list[Issue]:
    """Each `warm:` file is a prompt (read again by the runner at each start)."""
    from exod.config.warm import read_warm

    issues = []
    for i, path in enumerate(instance.warm):
        try:
            read_warm(path)
        except OSError as e:
            issues.append(Issue(f"warm[{i}]", f"cannot read {path}: {e.strerror or e}"))
        except ValueError as e:
            issues.append(Issue(f"warm[{i}]", f"{path}: {e}"))
    return issues


def check_ports(instances: Sequence[Instance]) -> list[tuple[Instance, Issue]]:
    """Port ranges [port_base, port_base + port_count) of different instances must not
    overlap."""
    ranged = sorted((i for i in instances if i.port_base is not None),
                    key=lambda i: (i.port_base or 0, i.name))
    found: list[tuple[Instance, Issue]] = []
    for k, later in enumerate(ranged):
        assert later.port_base is not None
        for earlier in ranged[:k]:
            assert earlier.port_base is not None
            if later.port_base < earlier.port_base + port_count(earlier):
                found.append((later, Issue(
                    "port_base",
                    f"ports {_span(later)} overlap those of instance {earlier.name!r} "
                    f"({_span(earlier)}, defined at {earlier.source})",
                )))
    return found


def check_names(instances: Sequence[Instance]) -> list[tuple[Instance, Issue]]:
    """Every name a request may give (an instance's own, its aliases; `:latest` or not) names
    one instance."""
    by_name = {i.name: i for i in instances}
    found = []
    for name, alias, owner in names.clashes({i.name: i.aliases for i in instances}):
        inst = by_name[name]
        why = "is already one of its names" if owner == name else (
            f"already names instance {owner!r} (defined at {by_name[owner].source})")
        if (owner, *by_name[owner].aliases).count(alias) < (2 if owner == name else 1):
            why += " (a name without a tag is the same name with `:latest`)"
        found.append((inst, Issue(f"aliases[{inst.aliases.index(alias)}]",
                                  f"{alias!r} {why}")))
    return found


def port_count(instance: Instance) -> int:
    """Ports from port_base on: one per rank, plus rank 0's control port for a group."""
    return instance.shards + 1 if instance.shards > 1 else 1


def _span(instance: Instance) -> str:
    first = instance.port_base or 0
    last = first + port_count(instance) - 1
    return str(first) if last == first else f"{first}-{last}"


def listen_problems(addresses: Sequence[str]) -> list[tuple[int, str]]:
    """(index, why) of each api.listen address that repeats an earlier one (port 0 aside:
    each of those binds its own free port)."""
    from exod.core.listen import parse_listen

    seen: dict[tuple[str, int], int] = {}
    out = []
    for i, a in enumerate(addresses):
        try:
            host, port = parse_listen(a)
        except ValueError:
            continue  # the pattern already refused it
        key = (host.lower(), port)
        if port and key in seen:
            out.append((i, f"{a} is listed twice (also api.listen[{seen[key]}])"))
        seen.setdefault(key, i)
    return out


def cluster_problems(cluster: Cluster) -> list[tuple[str, int | None, str]]:
    """(key, index in its list or None, why) of each problem of the `cluster:` section."""
    from exod.core.listen import parse_listen, parse_peer

    out: list[tuple[str, int | None, str]] = []
    if cluster.key_file is not None:
        problem = secret_problem(cluster.key_file, KEY_BYTES)
        if problem:
            out.append(("key_file", None, problem))
    try:
        _, port = parse_listen(cluster.listen)
    except ValueError:
        port = DEFAULT_CLUSTER_PORT  # the pattern already refused it
    for i, peer in enumerate(cluster.peers):
        try:
            parse_peer(peer, port or DEFAULT_CLUSTER_PORT)
        except ValueError as e:
            out.append(("peers", i, str(e)))
    return out
