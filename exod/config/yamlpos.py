"""YAML to a small tree in which every key and value knows its FILE:LINE:COL.

PyYAML's `safe_load` forgets positions and silently keeps the last of duplicate keys, both wrong
for an operator's config. We `compose` (parse without constructing), then convert the node graph
ourselves: positions kept, duplicates and non-string keys reported, aliases and `<<` merges
expanded, scalars constructed by PyYAML's safe constructor so `yes`/`0660`/`1e3` mean what YAML
says they mean (the raw text is kept beside, for messages and for YAML 1.1's surprises).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import yaml

from exod.config.errors import Mark, Problem
from exod.core.text import clip

_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_STR_TAG = "tag:yaml.org,2002:str"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_VALUE_TAG = "tag:yaml.org,2002:value"  # a bare `=`: PyYAML resolves it but cannot construct it

MAX_NODES = 100_000
"""Aliases can expand a small file exponentially ("billion laughs"); stop well before that hurts."""


@dataclass
class Scalar:
    value: object  # None, bool, int, float, str (dates or bytes only with explicit exotic tags)
    raw: str  # the text as written
    plain: bool  # unquoted: only then may `raw` stand in for a value YAML 1.1 mis-guessed ("no")
    mark: Mark


@dataclass
class MapEntry:
    key: str
    key_mark: Mark
    value: Node


@dataclass
class MapNode:
    mark: Mark
    entries: dict[str, MapEntry] = field(default_factory=dict)


@dataclass
class SeqNode:
    mark: Mark
    items: list[Node] = field(default_factory=list)


@dataclass
class Broken:
    """A value already reported as unreadable; consumers skip it without a second message."""

    mark: Mark


Node = Scalar | MapNode | SeqNode | Broken


def join_path(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


class _TooLarge(Exception):
    pass


def parse_yaml(
    text: str, file: str, noun: Callable[[str], str] = lambda parent: "key"
) -> tuple[Node | None, list[Problem]]:
    """Parse one YAML document. The node is None for an empty document or a syntax error.

    noun: what a key under `parent` is called in a duplicate's message ("duplicate instance").
    """
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        return None, [_syntax_problem(e, file)]
    except yaml.reader.ReaderError as e:
        line, col = _line_col(text, e.position)
        what = f"character #x{e.character:04x}" if isinstance(e.character, int) else "byte"
        return None, [Problem(file, line, col, "", f"unacceptable {what}: {e.reason}")]
    except yaml.YAMLError as e:  # any other PyYAML error: no position, still one clean line
        return None, [Problem(file, 0, 0, "", f"YAML error: {e}")]
    except RecursionError:
        return None, [Problem(file, 0, 0, "", "YAML is nested too deeply")]
    if root is None:
        return None, []
    conv = _Converter(file, noun)
    try:
        tree = conv.convert(root, "")
    except _TooLarge:
        return None, conv.problems + [
            Problem(file, 0, 0, "", f"too many values after expanding aliases (over {MAX_NODES})")
        ]
    except RecursionError:
        return None, conv.problems + [Problem(file, 0, 0, "", "YAML is nested too deeply")]
    return tree, conv.problems


def _syntax_problem(e: yaml.MarkedYAMLError, file: str) -> Problem:
    mark = e.problem_mark or e.context_mark
    line, col = (mark.line + 1, mark.column + 1) if mark is not None else (0, 0)
    message = f"YAML syntax error: {e.problem or e.context or 'cannot parse'}"
    if e.context and e.problem and e.problem.startswith("but "):  # "expected X, but found Y"
        message = f"YAML syntax error: {e.context}, {e.problem}"
    elif e.context and e.problem and e.context_mark is not None:
        message += f" ({e.context} at line {e.context_mark.line + 1})"
    return Problem(file, line, col, "", message)


def _line_col(text: str, position: int) -> tuple[int, int]:
    before = text[:position]
    return before.count("\n") + 1, position - (before.rfind("\n") + 1) + 1


class _Converter:
    def __init__(self, file: str, noun: Callable[[str], str]) -> None:
        self.file = file
        self.noun = noun
        self.problems: list[Problem] = []
        self.count = 0
        self.active: set[int] = set()  # ids of collection nodes being converted: catches `&a [*a]`
        self.constructor = yaml.SafeLoader("")

    def mark(self, node: yaml.Node) -> Mark:
        return Mark(self.file, node.start_mark.line + 1, node.start_mark.column + 1)

    def problem(self, mark: Mark, path: str, message: str) -> None:
        self.problems.append(Problem.at(mark, path, message))

    def convert(self, node: yaml.Node, path: str) -> Node:
        self.count += 1
        if self.count > MAX_NODES:
            raise _TooLarge
        mark = self.mark(node)
        if isinstance(node, yaml.ScalarNode):
            return self.scalar(node, path, mark)
        if id(node) in self.active:
            self.problem(mark, path, "an alias refers to a value that contains it (recursive)")
            return Broken(mark)
        expected = _MAP_TAG if isinstance(node, yaml.MappingNode) else _SEQ_TAG
        if node.tag != expected:
            self.problem(mark, path, f"unsupported YAML tag {node.tag!r}")
            return Broken(mark)
        self.active.add(id(node))
        try:
            if isinstance(node, yaml.MappingNode):
                return self.mapping(node, path, mark)
            items = [self.convert(n, f"{path}[{i}]") for i, n in enumerate(node.value)]
            return SeqNode(mark, items)
        finally:
            self.active.discard(id(node))

    def scalar(self, node: yaml.ScalarNode, path: str, mark: Mark) -> Node:
        if node.tag == _VALUE_TAG:
            return Scalar(node.value, node.value, node.style is None, mark)
        try:
            value = self.constructor.construct_object(node)
        except Exception as e:  # noqa: BLE001 -- PyYAML raises ValueError, KeyError… (`!!int abc`)
            reason = e.problem if isinstance(e, yaml.MarkedYAMLError) else (
                str(e) or type(e).__name__)
            self.problem(mark, path, f"cannot read value {_short(node.value)}: {reason}")
            return Broken(mark)
        return Scalar(value, node.value, node.style is None, mark)

    def mapping(self, node: yaml.MappingNode, path: str, mark: Mark) -> MapNode:
        out = MapNode(mark)
        merges: list[yaml.Node] = []
        for knode, vnode in node.value:
            if isinstance(knode, yaml.ScalarNode) and knode.tag == _MERGE_TAG:
                merges.append(vnode)
                continue
            kmark = self.mark(knode)
            key = self.key(knode, path, kmark)
            if key is None:
                continue
            sub = join_path(path, key)
            first = out.entries.get(key)
            if first is not None:
                self.problem(kmark, sub, f"duplicate {self.noun(path)} {key!r} "
                                         f"(first defined at {first.key_mark})")
                continue
            out.entries[key] = MapEntry(key, kmark, self.convert(vnode, sub))
        # `<<: *base`: keys written here win; among several merged maps the earlier wins.
        for merge in merges:
            sources = merge.value if isinstance(merge, yaml.SequenceNode) else [merge]
            for source in sources:
                merged = self.convert(source, path)
                if isinstance(merged, Broken):
                    continue
                if not isinstance(merged, MapNode):
                    self.problem(self.mark(source), path,
                                 "`<<` must merge a mapping or a list of mappings")
                    continue
                for key, entry in merged.entries.items():
                    out.entries.setdefault(key, entry)
        return out

    def key(self, knode: yaml.Node, path: str, kmark: Mark) -> str | None:
        if isinstance(knode, yaml.ScalarNode) and knode.tag == _STR_TAG:
            return str(knode.value)
        if isinstance(knode, yaml.ScalarNode):
            as_value = self.scalar(knode, path, kmark)
            if not isinstance(as_value, Broken):
                self.problem(kmark, path, f"keys must be strings, got {describe(as_value)} "
                                          f"(quote it: '{_clip(knode.value)}')")
        else:
            what = "a mapping" if isinstance(knode, yaml.MappingNode) else "a list"
            self.problem(kmark, path, f"keys must be strings, got {what}")
        return None


def _short(text: str, limit: int = 40) -> str:
    return repr(_clip(text, limit))


def describe(node: Node) -> str:
    """How a value reads in a message: `string 'abc'`, `integer 5`, `a list`…"""
    if isinstance(node, MapNode):
        return "a mapping"
    if isinstance(node, SeqNode):
        return "a list"
    if isinstance(node, Broken):
        return "an unreadable value"
    v = node.value
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"boolean {node.raw}"
    if isinstance(v, int):
        return f"integer {_clip(node.raw)}"
    if isinstance(v, float):
        return f"number {_clip(node.raw)}"
    if isinstance(v, str):
        return f"string {_short(v)}"
    return f"{type(v).__name__} {_short(node.raw)}"


def _clip(text: str, limit: int = 40) -> str:
    return clip(text, limit)
