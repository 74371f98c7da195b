"""`exod plan`: where the planner puts each `placement: auto` instance of a config, on this host
alone or on the nodes of `--nodes`; `--write` gives the same as explicit YAML (exod.cli.plan_yaml).
The planner is exod.core.placement; what a model costs is read by exod.daemon.placing, as the
daemon reads it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:  # the CLI's start stays fast: these are imported by the command itself
    from exod.config.schema import Config, Instance
    from exod.core.nodes import Link, NodeInfo
    from exod.core.placement import Placement


def model_here(cfg: Config, inst: Instance) -> Instance | str:
    """The instance at its model's files: a hub model's cached snapshot, or why not."""
    import dataclasses

    from exod.cli.hub_check import cache_of
    from exod.hub import cache as hub_cache

    if inst.hub is None:
        return inst
    found = hub_cache.cached(cache_of(cfg), inst.hub)
    if found is None:
        return f"{inst.name}: {inst.hub} is not in the cache yet: it is placed once fetched"
    return dataclasses.replace(inst, model=found.path)


def describe(p: Placement, context_tokens: int, width: int) -> list[str]:
    """The plan of one instance: a line for it, then one per rank."""
    from exod.core.placement.words import layers
    from exod.core.sizes import format_size

    nodes = p.nodes()
    mixed = len({n.backend for n in nodes}) > 1
    head = (f"{p.instance}: {p.parallelism}, {p.world} rank{'s' if p.world > 1 else ''} on "
            f"{len(nodes)} node{'s' if len(nodes) > 1 else ''}; {p.total} layers, KV cache for "
            f"{width} × {context_tokens} tokens")
    rows = [[f"rank {s.rank}", s.node.name + (f" ({s.node.backend})" if mixed else ""),
             layers(s.start, s.end) if p.parallelism == "pipeline" else
             f"1/{p.world} of every layer",
             f"needs {format_size(s.need.total)} of {format_size(s.room)}",
             f"(weights {format_size(s.need.weights)}, KV cache {format_size(s.need.kv)}, "
             f"runtime {format_size(s.need.runtime)}"
             + (f", vision {format_size(s.need.vision)}" if s.need.vision else "") + ")"]
            for s in p.seats]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return [head] + ["  " + "  ".join([*(c.ljust(w) for c, w in zip(r, widths, strict=False)),
                                        r[-1]])
                     for r in rows]


def place_all(cfg: Config, nodes: list[NodeInfo], links: list[Link]
              ) -> tuple[list[tuple[Instance, Placement]], list[str]]:
    """Each auto instance's placement, and a line for each that has none."""
    from exod.core.memory import HeaderError
    from exod.core.placement import PlacementRefused
    from exod.daemon import placing

    placed, refused = [], []
    for inst in cfg.instances.values():
        if inst.placement != "auto":
            continue
        here = model_here(cfg, inst)
        if isinstance(here, str):
            refused.append(here)
            continue
        try:
            placed.append((inst, placing.plan(here, nodes, links)))
        except PlacementRefused as e:
            refused.append(str(e))
        except (HeaderError, OSError) as e:
            refused.append(f"{inst.name}: cannot read its layer sizes: {e}")
    return placed, refused


def explicit_yaml(cfg: Config, placed: list[tuple[Instance, Placement]], nodes_from: str) -> str:
    """`--write`'s text; a note on stderr for each instance that still needs a key."""
    from exod.cli import plan_yaml

    taken = plan_yaml.taken_ports(cfg)
    written = {inst.name: plan_yaml.explicit(cfg, inst, p, taken) for inst, p in placed}
    for name, keys in written.items():
        if len({h["name"] for h in keys.get("hosts", ())}) > 1 and "cluster_key_file" not in keys:
            click.echo(f"note: {name}: ranks on several hosts need `cluster_key_file` (the same "
                       "secret file on each host; or set `cluster.key_file`): add it", err=True)
    return plan_yaml.document(cfg, written, nodes_from, [p for _, p in placed])


def write_new(output: Path, text: str) -> None:
    """Write a file that does not exist yet: never the operator's own, silently replaced."""
    try:
        with open(output, "x", encoding="utf-8") as f:
            f.write(text)
    except FileExistsError:
        raise click.ClickException(f"{output} exists: not overwritten (remove it, or name "
                                   "another file)") from None
    except OSError as e:
        raise click.ClickException(f"cannot write {output}: {e.strerror or e}") from None


@click.command("plan")
@click.option("-c", "--config", "config", metavar="FILE", default=None,
              help="Config file [default: $EXOD_CONFIG, else /etc/exod/exod.yaml].")
@click.option("--nodes", "nodes_file", type=click.Path(dir_okay=False, path_type=Path),
              default=None, metavar="FILE",
              help="Place on these nodes (JSON: a list of nodes, or nodes and links) instead "
                   "of this host alone.")
@click.option("--write", is_flag=True,
              help="Print the plan as the explicit keys (shards, layers, hosts, port_base).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              metavar="FILE", help="With --write: write it to FILE, which must not exist yet.")
def plan(config: str | None, nodes_file: Path | None, write: bool, output: Path | None) -> None:
    """Where each `placement: auto` instance would run: which node, which layers, what each
    rank needs and the room it has. Exits 1 when one cannot be placed."""
    from exod.cli.plan_nodes import read_nodes
    from exod.config import ConfigError, load_config, resolve_config_path
    from exod.core.exits import EXIT_CONFIG
    from exod.daemon import placing

    if output is not None and not write:
        raise click.UsageError("--output goes with --write")
    path = resolve_config_path(config)
    try:
        cfg = load_config(path)
    except ConfigError as e:
        click.echo(str(e), err=True)
        sys.exit(EXIT_CONFIG)
    if nodes_file is not None:
        try:
            nodes, links = read_nodes(nodes_file)
        except ValueError as e:
            raise click.ClickException(str(e)) from None
    else:
        nodes, links = placing.members(placing.this_node(cfg.node.name,
                                                         cfg.defaults.memory_headroom))
    placed, refused = place_all(cfg, nodes, links)
    for line in refused:
        click.echo(line, err=True)
    if not placed and not refused:
        click.echo(f"{path}: no instance has `placement: auto`")
        return
    if refused:
        n = len(refused)
        raise click.ClickException(f"{n} instance{'s' if n > 1 else ''} not placed")
    if not write:
        for inst, p in placed:
            width = inst.max_concurrency or 1
            for line in describe(p, inst.context_tokens, width):
                click.echo(line)
        return
    text = explicit_yaml(cfg, placed, str(nodes_file) if nodes_file
                         else f"this host ({cfg.node.name})")
    if output is None:
        click.echo(text, nl=False)
        return
    write_new(output, text)
    click.echo(f"wrote {output}")

