"""A generic validator: walks the schema dataclasses and builds them from a positioned YAML tree.

Nothing here knows a particular key; types, `Kind`s and field metadata (`minimum`, `maximum`,
`above`, `pattern`, `internal`, `inherit`) drive everything, so a field added to the schema is
validated without touching this file. Every problem is recorded and validation goes on: the
operator sees all of them at once.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import math
import os
import re
import types
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin, get_type_hints

from exod.core.durations import format_duration, parse_duration
from exod.config.errors import Mark, Problem
from exod.facts.model_dir import model_dir_problem
from exod.core.sizes import parse_size
from exod.core.kinds import AUTO, INSTANCE_NAME_RE, Kind
from exod.config.yamlpos import (
    Broken,
    MapEntry,
    MapNode,
    Node,
    Scalar,
    SeqNode,
    describe,
    join_path,
)

ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INSTANCE_NAME = re.compile(INSTANCE_NAME_RE)
_NOTHING = dataclasses.MISSING


class _Invalid:
    """A value that failed validation; its problem is already recorded."""

    def __repr__(self) -> str:
        return "INVALID"


INVALID: Any = _Invalid()


@cache
def field_hints(cls: type) -> dict[str, Any]:
    # The schema uses `from __future__ import annotations`: resolve the strings, keep Annotated.
    return get_type_hints(cls, include_extras=True)


def settable_fields(cls: type) -> list[dataclasses.Field[Any]]:
    """The fields an operator may write (internal ones are filled in by exod): a class's own
    first, then those it inherits (an instance's runner options come after its model)."""
    own = cls.__dict__.get("__annotations__", {})
    fields = [f for f in dataclasses.fields(cls) if f.init and not f.metadata.get("internal")]
    return sorted(fields, key=lambda f: f.name not in own)


def unwrap(hint: Any) -> tuple[Any, Kind | None, bool]:
    """(bare type, Kind or None, optional?) of a field's type hint."""
    kind: Kind | None = None
    optional = False
    while True:
        origin = get_origin(hint)
        if origin is Annotated:
            hint, *extras = get_args(hint)
            kind = next((e for e in extras if isinstance(e, Kind)), kind)
        elif origin in (Union, types.UnionType):
            args = [a for a in get_args(hint) if a is not type(None)]
            if len(args) != 1:  # only Optional[X]: a real union would need a rule to pick a type
                raise TypeError(f"unsupported union in the schema: {hint!r}")
            optional = optional or len(args) < len(get_args(hint))
            hint = args[0]
        else:
            return hint, kind, optional


def instance_name_problem(name: str) -> str | None:
    if _INSTANCE_NAME.match(name):
        return None
    return (f"bad instance name {name!r}: use 1 to 63 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit")


def resolve_path(text: str, mark: Mark) -> Path:
    """`~` expanded; a relative path is taken from the folder of the file that holds it."""
    expanded = os.path.expanduser(text)
    folder = os.path.dirname(os.path.abspath(mark.file))
    return Path(os.path.normpath(os.path.join(folder, expanded)))


def _is_null(node: Node | None) -> bool:
    return node is None or (isinstance(node, Scalar) and node.value is None)


class Validator:
    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def report(self, mark: Mark, path: str, message: str) -> Any:
        self.problems.append(Problem.at(mark, path, message))
        return INVALID

    # -- dataclasses -------------------------------------------------------------------------

    def build(
        self,
        cls: type,
        node: Node | None,
        path: str,
        owner: Mark,
        *,
        given: Mapping[str, object] | None = None,
        base: object | None = None,
        inherit_from: object | None = None,
    ) -> Any:
        """An instance of dataclass `cls` from a mapping node, or INVALID.

        owner: where a missing key is reported (the key that holds this mapping).
        given: values the caller decided (internal fields, sections validated separately).
        base: an instance whose values stand in for keys not written (a partial override).
        inherit_from: the object `inherit="<field>"` metadata takes its defaults from.
        """
        given = given or {}
        entries = self._entries(node, path)
        if entries is None:
            return INVALID
        fields = [f for f in dataclasses.fields(cls) if f.init]
        internal = {f.name for f in fields if f.metadata.get("internal")}
        ok = self._check_keys(cls, entries, path)
        hints = field_hints(cls)
        kwargs: dict[str, object] = {}
        for f in fields:
            if f.name in given:
                kwargs[f.name] = given[f.name]
                continue
            if f.name in internal:
                continue
            inherited: object = _NOTHING
            if inherit_from is not None and "inherit" in f.metadata:
                inherited = getattr(inherit_from, str(f.metadata["inherit"]))
            elif base is not None:
                inherited = getattr(base, f.name)
            written = entries.get(f.name)
            if written is None:
                if inherited is not _NOTHING:
                    kwargs[f.name] = inherited
                elif f.default is _NOTHING and f.default_factory is _NOTHING:
                    ok = False
                    self.report(owner, path, f"missing required key {f.name!r}")
                continue
            value = self.value(hints[f.name], written.value, join_path(path, f.name),
                               written.key_mark, f.metadata, inherited)
            if value is INVALID:
                ok = False
            else:
                kwargs[f.name] = value
        return cls(**kwargs) if ok else INVALID

    def _entries(self, node: Node | None, path: str) -> dict[str, MapEntry] | None:
        """The entries of a mapping node; None (reported) when it is not one."""
        if isinstance(node, Broken):
            return None
        if _is_null(node):
            return {}  # `stop:` with nothing under it: all defaults, like an empty mapping
        if isinstance(node, MapNode):
            return dict(node.entries)
        assert node is not None
        self.report(node.mark, path, f"expected a mapping, got {describe(node)}")
        return None

    def _check_keys(self, cls: type, entries: dict[str, MapEntry], path: str) -> bool:
        """Every written key is one an operator may set; each one that is not is reported."""
        settable = [f.name for f in settable_fields(cls)]
        internal = {f.name: f for f in dataclasses.fields(cls)
                    if f.init and f.metadata.get("internal")}
        ok = True
        for key, entry in entries.items():
            if key in internal:
                ok = False
                doc = internal[key].metadata.get("doc", "")
                self.report(entry.key_mark, join_path(path, key),
                            f"cannot be set in the file; exod sets it ({doc})")
            elif key not in settable:
                ok = False
                self.unknown_key(entry.key_mark, join_path(path, key), key, settable)
        return ok

    def unknown_key(self, mark: Mark, path: str, key: str, allowed: list[str]) -> None:
        # "kill-interval" → "kill_interval" is the commonest slip; difflib catches it too.
        close = difflib.get_close_matches(key.replace("-", "_"), allowed, n=1)
        if close:
            self.report(mark, path, f"unknown key {key!r}; did you mean {close[0]!r}?")
        else:
            self.report(mark, path, f"unknown key {key!r}; allowed keys: {', '.join(allowed)}")

    # -- values ------------------------------------------------------------------------------

    def value(
        self,
        hint: Any,
        node: Node,
        path: str,
        owner: Mark,
        meta: Mapping[str, object],
        base: object = _NOTHING,
    ) -> Any:
        """The Python value of `node` for type `hint`, or INVALID."""
        if isinstance(node, Broken):
            return INVALID
        bare, kind, optional = unwrap(hint)
        origin = get_origin(bare)
        if _is_null(node) and optional:
            return None
        if kind is not None:
            return self.kind_value(kind, node, path, meta)
        if origin is Literal:
            return self.literal(get_args(bare), node, path)
        if origin is tuple:
            return self.sequence(get_args(bare)[0], node, path, meta)
        if origin is Mapping:
            return self.mapping(get_args(bare)[1], node, path, meta)
        if isinstance(bare, type) and dataclasses.is_dataclass(bare):
            return self.build(bare, node, path, owner,
                              base=base if isinstance(base, bare) else None)
        if bare in (bool, int, float, str, Path):
            return self.scalar(bare, node, path, meta)
        raise TypeError(f"unsupported type in the schema at {path}: {bare!r}")

    def scalar(self, want: type, node: Node, path: str, meta: Mapping[str, object]) -> Any:
        v = node.value if isinstance(node, Scalar) else _NOTHING
        if want is bool:
            if isinstance(v, bool):
                return v
            return self.report(node.mark, path, f"expected true or false, got {describe(node)}")
        if want is int:
            if isinstance(v, int) and not isinstance(v, bool):
                return self.in_range(v, node, path, meta)
            return self.report(node.mark, path, f"expected an integer, got {describe(node)}")
        if want is float:
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                try:
                    f = float(v)
                except OverflowError:
                    f = math.inf
                if not math.isfinite(f):
                    return self.report(node.mark, path,
                                       f"expected a finite number, got {describe(node)}")
                return self.in_range(f, node, path, meta)
            return self.report(node.mark, path, f"expected a number, got {describe(node)}")
        if not isinstance(v, str):
            quotable = isinstance(node, Scalar) and node.plain and v is not None
            hint = " (quote it)" if quotable else ""
            return self.report(node.mark, path, f"expected a string, got {describe(node)}{hint}")
        if want is Path:
            return self.path(v, node, path)
        pattern = meta.get("pattern")
        if isinstance(pattern, str) and not re.search(pattern, v):
            return self.report(node.mark, path, f"{v!r} does not match {pattern}")
        return v

    def in_range(self, v: float, node: Node, path: str, meta: Mapping[str, object],
                 duration: bool = False) -> Any:
        # An integer bound as written (`:g` shows 2^30 as 1.07374e+09).
        show = format_duration if duration else (
            lambda x: str(x) if isinstance(x, int) else f"{x:g}")
        low, high, above = meta.get("minimum"), meta.get("maximum"), meta.get("above")
        got = node.raw if isinstance(node, Scalar) else str(v)
        if isinstance(above, (int, float)) and v <= above:
            return self.report(node.mark, path, f"must be more than {show(above)}, got {got}")
        if isinstance(low, (int, float)) and v < low:
            return self.report(node.mark, path, f"must be at least {show(low)}, got {got}")
        if isinstance(high, (int, float)) and v > high:
            return self.report(node.mark, path, f"must be at most {show(high)}, got {got}")
        return v

    def literal(self, allowed: tuple[object, ...], node: Node, path: str) -> Any:
        if isinstance(node, Scalar):
            for a in allowed:  # `true` is not `'true'`, and 1 is not `true`
                if type(node.value) is type(a) and node.value == a:
                    return a
            # YAML 1.1 reads a bare `no` as false; the operator meant the word.
            if node.plain and node.raw in allowed:
                return node.raw
        choices = ", ".join(str(a).lower() if isinstance(a, bool) else repr(a) for a in allowed)
        message = f"must be one of {choices}; got {describe(node)}"
        if isinstance(node, Scalar) and isinstance(node.value, str):
            close = difflib.get_close_matches(node.value.replace("_", "-"),
                                              [str(a) for a in allowed], n=1)
            if close:
                message += f"; did you mean {close[0]!r}?"
        return self.report(node.mark, path, message)

    def sequence(self, item: Any, node: Node, path: str, meta: Mapping[str, object]) -> Any:
        if _is_null(node):
            return ()
        if isinstance(node, Scalar) and item is str and not isinstance(node.value, bool):
            if node.value == "":
                return ()  # `listen: ""`: none
            # `include: "x/*.yaml"` means a list of one, checked as its item is
            one = self.value(item, node, path, node.mark, meta)
            return INVALID if one is INVALID else (one,)
        if not isinstance(node, SeqNode):
            return self.report(node.mark, path, f"expected a list, got {describe(node)}")
        out = [self.value(item, n, f"{path}[{i}]", n.mark, meta) for i, n in enumerate(node.items)]
        return INVALID if any(v is INVALID for v in out) else tuple(out)

    def mapping(self, item: Any, node: Node, path: str, meta: Mapping[str, object]) -> Any:
        if _is_null(node):
            return {}
        if not isinstance(node, MapNode):
            return self.report(node.mark, path, f"expected a mapping, got {describe(node)}")
        out: dict[str, object] = {}
        ok = True
        for key, entry in node.entries.items():
            sub = join_path(path, key)
            if item is str:
                if not ENV_NAME_RE.fullmatch(key):
                    ok = False
                    self.report(entry.key_mark, sub,
                                f"{key!r} is not a valid environment variable name "
                                "(letters, digits and _, not starting with a digit)")
                value = self.env_value(entry.value, sub)
            else:
                value = self.value(item, entry.value, sub, entry.key_mark, meta)
            if value is INVALID:
                ok = False
            out[key] = value
        return out if ok else INVALID

    def env_value(self, node: Node, path: str) -> Any:
        """Any scalar, as written: `DEBUG: yes` gives "yes", `MASK: 0660` gives "0660"."""
        if isinstance(node, Broken):
            return INVALID
        if isinstance(node, Scalar) and node.value is not None:
            return node.value if isinstance(node.value, str) else node.raw
        extra = " (write '' for an empty value)" if isinstance(node, Scalar) else ""
        return self.report(node.mark, path, f"expected a string, got {describe(node)}{extra}")

    # -- kinds -------------------------------------------------------------------------------

    def kind_value(self, kind: Kind, node: Node, path: str, meta: Mapping[str, object]) -> Any:
        if kind is Kind.DURATION:
            if not isinstance(node, Scalar) or not isinstance(node.value, (int, float, str)) or (
                    isinstance(node.value, bool)):
                return self.report(node.mark, path,
                                   f"expected a duration like 10s, got {describe(node)}")
            try:
                seconds = parse_duration(node.value)
            except ValueError as e:
                return self.report(node.mark, path, str(e))
            return self.in_range(seconds, node, path, meta, duration=True)
        if kind is Kind.DURATION_OR_NEVER:
            if isinstance(node, Scalar) and node.value == "never":
                return math.inf
            return self.kind_value(Kind.DURATION, node, path, meta)
        if kind is Kind.SIZE:
            if not isinstance(node, Scalar):
                return self.report(node.mark, path, f"expected a size like 2GiB, got "
                                                    f"{describe(node)}")
            try:
                return self.in_range(parse_size(node.value), node, path, meta)
            except ValueError as e:
                return self.report(node.mark, path, str(e))
        if kind is Kind.OCTAL:
            return self.octal(node, path)
        if kind is Kind.COUNT_OR_AUTO:
            if isinstance(node, Scalar) and node.value == "auto":
                return AUTO
            if isinstance(node, Scalar) and isinstance(node.value, int) and not isinstance(
                    node.value, bool):
                return self.in_range(node.value, node, path, meta)
            return self.report(node.mark, path, f"expected an integer or auto, got "
                                                f"{describe(node)}")
        if kind is Kind.JSON:
            return self.plain_data(node, path)
        value = self.scalar(Path if kind in (Kind.PATH, Kind.MODEL_DIR) else str, node, path, meta)
        if value is INVALID:
            return INVALID
        if kind is Kind.MODEL_DIR:
            problem = model_dir_problem(value)
            return self.report(node.mark, path, problem) if problem else value
        if kind is Kind.INSTANCE_NAME:
            problem = instance_name_problem(value)
            return self.report(node.mark, path, problem) if problem else value
        if kind is Kind.NETWORK:
            try:
                return str(ipaddress.ip_network(value, strict=False))
            except ValueError:
                return self.report(node.mark, path, f"{value!r} is not an IP network (like "
                                                    "10.1.0.0/16) nor an IP address")
        return value

    def plain_data(self, node: Node, path: str) -> Any:
        """A YAML value as JSON has it (what a client could send in a request body)."""
        if isinstance(node, Broken):
            return INVALID
        if isinstance(node, Scalar):
            v = node.value
            if v is None or isinstance(v, (bool, int, str)) or (
                    isinstance(v, float) and math.isfinite(v)):
                return v
            return self.report(node.mark, path, f"expected plain data (JSON), got "
                                                f"{describe(node)}")
        if isinstance(node, SeqNode):
            items = [self.plain_data(n, f"{path}[{i}]") for i, n in enumerate(node.items)]
            return INVALID if any(v is INVALID for v in items) else items
        out = {k: self.plain_data(e.value, join_path(path, k)) for k, e in node.entries.items()}
        return INVALID if any(v is INVALID for v in out.values()) else out

    def path(self, text: str, node: Node, path: str) -> Any:
        if not text:
            return self.report(node.mark, path, "expected a path, got an empty string")
        if "\0" in text:
            return self.report(node.mark, path, "a path cannot contain a NUL character")
        return resolve_path(text, node.mark)

    def octal(self, node: Node, path: str) -> Any:
        """A file mode: 0660 (YAML reads it as octal), '0660', '0o660', or a plain int like 432."""
        v = node.value if isinstance(node, Scalar) else None
        mode: int | None = None
        if isinstance(v, int) and not isinstance(v, bool):
            mode = v
        elif isinstance(v, str):
            digits = v.strip().lower().removeprefix("0o")
            if digits and all(c in "01234567" for c in digits) and len(digits) <= 6:
                mode = int(digits, 8)
        if mode is None:
            return self.report(node.mark, path,
                               f"expected an octal file mode like 0660, got {describe(node)}")
        if not 0 <= mode <= 0o777:
            hint = ""
            if isinstance(node, Scalar) and node.raw.isdigit() and set(node.raw) <= set("01234567"):
                hint = f"; did you mean 0{node.raw} (octal)?"
            return self.report(node.mark, path,
                               f"file mode {node.raw if isinstance(node, Scalar) else mode} "
                               f"is out of range 0..0777{hint}")
        return mode
