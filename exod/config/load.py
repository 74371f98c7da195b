"""Load the main config file and its includes into a validated `Config`, or raise `ConfigError`.

Validate-then-apply: this either returns a whole `Config` or raises with every problem found;
nothing half-loaded ever escapes, so a reload with a bad file can keep the running config.
"""

from __future__ import annotations

import dataclasses
import glob
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from exod.config.checks import (Issue, cluster_problems, check_layout, check_names, check_on_demand,
                                check_placement, check_ports, check_sharding,
                                check_template_kwargs, check_warm, listen_problems)
from exod.config.model_checks import check_embed, check_vision
from exod.facts.probe import answers as probe_answers
from exod.config.errors import ConfigError, Mark, Problem
from exod.config.keys import key_problems
from exod.config.hub_model import names_hub, parse_model, placeholder
from exod.config.mlx_options import check_mlx_options
from exod.facts.model_dir import model_layer_count
from exod.config.safety import control_socket_problem
from exod.config.schema import DEFAULT_CONFIG_PATH, Cluster, Config, Defaults, Instance
from exod.config.schema import Node as NodeSection
from exod.config.validate import INVALID, Validator, field_hints, instance_name_problem
from exod.core.kinds import AUTO
from exod.config.yamlpos import MapEntry, MapNode, Node, Scalar, SeqNode, describe, parse_yaml
from exod.secret_file import secret_problem

__all__ = ["ENV_VAR", "load_config", "model_layer_count", "resolve_config_path"]

ENV_VAR = "EXOD_CONFIG"


def resolve_config_path(cli_value: str | None) -> Path:
    """Which file to load: the CLI's value, else $EXOD_CONFIG, else the schema's default."""
    chosen = cli_value or os.environ.get(ENV_VAR) or None
    return Path(os.path.expanduser(chosen)) if chosen else DEFAULT_CONFIG_PATH


def load_config(path: Path, on_probe: Callable[[float], None] | None = None) -> Config:
    """Read, validate and cross-check `path` and the files it includes. `on_probe(seconds)` is
    called before layouts are probed, with how long the probe may take at most (exod tells its
    service manager, so a slow first probe never trips a start timeout)."""
    return _Loader(Path(path), on_probe).load()


def _read(path: Path, display: str) -> tuple[Node | None, list[Problem]]:
    """The file's YAML tree; (None, problems) when it is unreadable, not YAML, or empty."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        return None, [Problem(display, 0, 0, "", f"cannot read: {e.strerror or e}")]
    except UnicodeDecodeError as e:
        return None, [Problem(display, 0, 0, "", f"cannot read: not UTF-8 text (byte {e.start})")]
    except ValueError as e:  # e.g. a NUL in the file name
        return None, [Problem(display, 0, 0, "", f"cannot read: {e}")]
    root, problems = parse_yaml(text, display, _noun)
    if isinstance(root, Scalar) and root.value is None and not root.raw:
        root = None  # only `---` or a directive: as empty as a blank file
    if root is None and not problems:
        problems = [Problem(display, 1, 1, "", "the file is empty (only comments or blanks)")]
    return root, problems


def _node_of(root: MapNode, *keys: str) -> Node:
    """The value at `keys`, else the nearest enclosing one (or the file's)."""
    node: Node = root
    for key in keys:
        if not isinstance(node, MapNode) or key not in node.entries:
            break
        node = node.entries[key].value
    return node


def _mark_of(root: MapNode, *keys: str) -> Mark:
    """Where the value at `keys` is written, else the nearest enclosing key (or the file)."""
    return _node_of(root, *keys).mark


def _kind(node: Node) -> str:
    """What a node is, without quoting it: an included file may hold anything."""
    return "a list" if isinstance(node, SeqNode) else "a scalar value"


def _noun(parent: str) -> str:
    return "instance" if parent == "instances" else "key"


class _Loader:
    def __init__(self, path: Path, on_probe: Callable[[float], None] | None = None) -> None:
        self.on_probe = on_probe
        self.path = path
        self.display = str(path)
        self.v = Validator()
        self.files: list[str] = []  # in reading order, to sort problems by file first
        self.instances: dict[str, Instance] = {}
        self.first_seen: dict[str, Mark] = {}
        self.nodes: dict[str, MapNode] = {}  # instance name → its mapping, to place Issues

    def load(self) -> Config:
        self.files.append(self.display)
        root, problems = _read(self.path, self.display)
        if root is None:
            raise ConfigError(problems)
        self.v.problems += problems
        if not isinstance(root, MapNode):
            self.v.report(root.mark, "", "the top level must be a mapping of settings "
                                         "(node, control, api, defaults, instances…); "
                                         f"got {describe(root)}")
            raise ConfigError(self.v.problems)
        entries = root.entries
        hints = field_hints(Config)

        include: Any = ()
        if "include" in entries:
            e = entries["include"]
            include = self.v.value(hints["include"], e.value, "include", e.key_mark, {})

        d = entries.get("defaults")
        defaults = self.v.build(Defaults, d.value if d else None, "defaults",
                                d.key_mark if d else root.mark)
        inherit_from = defaults if defaults is not INVALID else None

        self.add_instances(entries.get("instances"), inherit_from)
        if include is not INVALID:
            for file in self.included_files(include, entries.get("include")):
                self.read_included(file, inherit_from)
        config = self.v.build(
            Config, root, "", root.mark,
            given={"path": Path(os.path.abspath(self.path)), "include": include,
                   "defaults": defaults, "instances": self.instances},
        )
        # Sharding checks need node.name (which host is this one), known only now.
        self.cross_check(config.node.name if isinstance(config, Config) else NodeSection().name)
        if isinstance(config, Config):
            self.check_listen(root, config.api.listen)
            self.v.problems += key_problems(config.api.keys, _node_of(root, "api", "keys"),
                                            "api.keys", self.instances)
            problem = control_socket_problem(config)
            if problem:
                self.v.report(_mark_of(root, "control", "socket"), "control.socket", problem)
            token = config.hub.hf_token_file
            problem = None if token is None else secret_problem(token, least=0)
            if problem:
                self.v.report(_mark_of(root, "hub", "hf_token_file"), "hub.hf_token_file",
                              problem)
            self.check_cluster(root, config.cluster)
        if self.v.problems:
            raise ConfigError(self.sorted_problems())
        assert isinstance(config, Config)
        return config

    # -- includes ----------------------------------------------------------------------------

    def included_files(self, patterns: tuple[str, ...], entry: MapEntry | None) -> list[str]:
        """Files matched by the `include:` patterns, each pattern's matches in sorted order.

        Relative patterns are taken from the main file's folder. A pattern matching nothing is
        fine: an empty drop-in folder is normal. Skipped: the main file itself (so
        `include: "*.yaml"` beside it does what it says), directories, and anything that is not a
        regular file, such as a symlink to /dev/null that masks a drop-in as in systemd.
        A dangling symlink is read, and reported.
        """
        folder = os.path.dirname(self.display) or "."
        main = os.path.abspath(self.display)
        tree = os.path.realpath(folder)
        seen = {main}
        out: list[str] = []
        for i, pattern in enumerate(patterns):
            where = self.item_mark(entry, i)
            if not pattern.strip() or "\0" in pattern:
                self.v.report(where, f"include[{i}]", f"bad pattern {pattern!r}")
                continue
            pattern = os.path.expanduser(pattern)
            try:
                # root_dir: the main file's folder may itself hold glob characters like '['.
                matches = sorted(glob.glob(pattern, root_dir=folder))
            except (OSError, ValueError) as e:
                self.v.report(where, f"include[{i}]", f"cannot expand {pattern!r}: {e}")
                continue
            for match in matches:
                file = os.path.join(folder, match) if folder != "." else match
                if os.path.abspath(file) in seen or (
                        os.path.exists(file) and not os.path.isfile(file)):
                    continue
                seen.add(os.path.abspath(file))
                real = os.path.realpath(file)
                if os.path.commonpath([tree, real]) != tree:
                    # A daemon running as root must not be made to read (and quote in its
                    # errors) any file on the system: includes stay in the config's tree.
                    self.v.report(where, f"include[{i}]",
                                  f"{file} is outside {tree} (included files must be in the "
                                  "main file's folder or below it): not read")
                    continue
                out.append(file)
        return out

    @staticmethod
    def item_mark(entry: MapEntry | None, i: int) -> Mark:
        assert entry is not None
        node = entry.value
        if isinstance(node, SeqNode) and i < len(node.items):
            return node.items[i].mark
        return node.mark

    def read_included(self, file: str, inherit_from: Defaults | None) -> None:
        self.files.append(file)
        root, problems = _read(Path(file), file)
        self.v.problems += problems
        if root is None:
            return
        if not isinstance(root, MapNode):
            self.v.report(root.mark, "", "an included file must be a mapping holding "
                                         f"`instances:`; got {_kind(root)}")
            return
        for key, entry in root.entries.items():
            if key != "instances":
                where = " (it belongs in the main file)" if key in field_hints(Config) else ""
                self.v.report(entry.key_mark, key, "only `instances:` may be set in an included "
                                                   f"file{where}")
        self.add_instances(root.entries.get("instances"), inherit_from)

    # -- instances ---------------------------------------------------------------------------

    def add_instances(self, entry: MapEntry | None, inherit_from: Defaults | None) -> None:
        if entry is None:
            return
        node = entry.value
        if isinstance(node, Scalar) and node.value is None:
            return  # `instances:` with everything below commented out
        if not isinstance(node, MapNode):
            if not isinstance(node, (Scalar, SeqNode)):
                return  # Broken: already reported
            self.v.report(node.mark, "instances",
                          f"expected a mapping of instance name to settings, got {describe(node)}")
            return
        for name, e in node.entries.items():
            path = f"instances.{name}"
            bad_name = instance_name_problem(name)
            if bad_name:
                self.v.report(e.key_mark, path, bad_name)
            first = self.first_seen.get(name)
            if first is not None:
                self.v.report(e.key_mark, path,
                              f"duplicate instance {name!r} (first defined at {first})")
                continue
            self.first_seen[name] = e.key_mark
            hub_names = self.hub_names(e.value, path)
            if hub_names is None:
                continue
            given: dict[str, object] = {"name": name, "source": str(e.key_mark), **hub_names}
            instance = self.v.build(Instance, e.value, path, e.key_mark, given=given,
                                    inherit_from=inherit_from)
            if instance is INVALID or bad_name:
                continue
            body = e.value if isinstance(e.value, MapNode) else MapNode(e.key_mark)
            if instance.placement == "auto" and "shards" not in body.entries:
                instance = dataclasses.replace(instance, shards=AUTO)  # auto's own default
            self.instances[name] = instance
            self.nodes[name] = body
            for issue in [*check_placement(instance, body.entries),
                          *check_layout(instance, body.entries),
                          *check_on_demand(instance, body.entries),
                          *check_template_kwargs(instance), *check_warm(instance),
                          *check_mlx_options(instance, body.entries),
                          *check_vision(instance), *check_embed(instance)]:
                self.report_issue(instance, issue)

    # An instance's keys that may name a model on the hub, and where its reference goes.
    HUB_KEYS = (("model", "hub"), ("draft_model", "draft_hub"))

    def hub_names(self, node: Node, path: str) -> dict[str, object] | None:
        """The hub models an instance names: each key's placeholder path and its reference,
        or None when one is malformed (reported; the instance is left out)."""
        given: dict[str, object] = {}
        for key, ref_key in self.HUB_KEYS:
            entry = node.entries.get(key) if isinstance(node, MapNode) else None
            if entry is None or not names_hub(entry.value):
                continue
            ref, problems = parse_model(entry.value, f"{path}.{key}")
            for mark, where, message in problems:
                self.v.report(mark, where, message)
            if ref is None:
                return None
            given.update({key: placeholder(ref), ref_key: ref})
        return given

    def cross_check(self, node_name: str) -> None:
        # One probe process for every layout not yet cached (exod.facts.probe).
        probe_answers([(i.model, i.shards, i.parallelism, i.layers)
                       for i in self.instances.values() if i.shards > 1], self.on_probe)
        for instance in self.instances.values():
            for issue in check_sharding(instance, node_name):
                self.report_issue(instance, issue)
        for instance, issue in [*check_ports(list(self.instances.values())),
                                *check_names(list(self.instances.values()))]:
            self.report_issue(instance, issue)

    def check_listen(self, root: MapNode, addresses: tuple[str, ...]) -> None:
        node = _node_of(root, "api", "listen")
        for i, why in listen_problems(addresses):
            mark = node.items[i].mark if isinstance(node, SeqNode) else node.mark
            self.v.report(mark, f"api.listen[{i}]", why)

    def check_cluster(self, root: MapNode, cluster: Cluster) -> None:
        for key, index, why in cluster_problems(cluster):
            node = _node_of(root, "cluster", key)
            mark = node.mark
            if index is not None and isinstance(node, SeqNode) and index < len(node.items):
                mark = node.items[index].mark
            self.v.report(mark, f"cluster.{key}" + ("" if index is None else f"[{index}]"),
                          why)

    def report_issue(self, instance: Instance, issue: Issue) -> None:
        """Place an Issue ("layers[1]") at the value it is about, else at the instance's key."""
        body = self.nodes[instance.name]
        key, _, rest = issue.key.partition("[")
        entry = body.entries.get(key)
        mark = self.first_seen[instance.name]
        if entry is not None:
            mark = entry.value.mark
            if rest and isinstance(entry.value, SeqNode):
                i = int(rest.rstrip("]"))
                if i < len(entry.value.items):
                    mark = entry.value.items[i].mark
        self.v.report(mark, f"instances.{instance.name}.{issue.key}", issue.message)

    def sorted_problems(self) -> list[Problem]:
        rank = {f: i for i, f in enumerate(self.files)}
        unique = list(dict.fromkeys(self.v.problems))  # an anchor used twice reports once
        return sorted(unique, key=lambda p: (rank.get(p.file, len(rank)), p.line, p.col))
