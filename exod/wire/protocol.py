"""The one wire format of exod's processes: frames of JSON objects, each object a typed message.

Framing: each frame is a 4-byte big-endian length then that many bytes of UTF-8 JSON (an
object). Carried by the daemon ↔ runner channel (what the objects say: `exod.wire.messages`) and
by a group's control connections (`exod.runner.group.wire`). The control socket that exoctl
talks to carries the same objects one per line instead (see `exod.wire.control` for why).

Messages: frozen dataclasses whose `type` ClassVar names them on the wire (the `tag` key,
"type" unless a wire says otherwise). `to_wire` turns one into its JSON object, `from_wire`
turns an object back into one of the classes a receiver allows, checking every field (its type,
required, no unknown keys, nested messages and Literal choices alike) before anyone acts on it:
ProtocolError for anything else, never another exception. Paths travel as text, tuples as
lists, the config schema's own classes too (a runner's options, exod.wire.specs).

JSON, not pickle: a peer must never be able to make us execute anything. Imports nothing heavy.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import struct
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path, PurePath
from typing import Any, Literal, Union

from exod.core.text import clip

HEADER = struct.Struct("!I")
MAX_FRAME = 64 * 1024 * 1024  # far above any real message; stops a corrupt length from OOMing us

Message = dict[str, Any]


class ProtocolError(Exception):
    pass


# ---- framing --------------------------------------------------------------------------------
def encode(msg: Message) -> bytes:
    body = json.dumps(msg, separators=(",", ":"), ensure_ascii=False).encode()
    return HEADER.pack(len(body)) + body


class FrameDecoder:
    """Incremental decoder: feed bytes as they arrive, get whole messages back. A frame
    announced longer than `limit` is a ProtocolError before any of it is buffered."""

    def __init__(self, limit: int = MAX_FRAME) -> None:
        self._buf = bytearray()
        self.limit = limit

    def feed(self, data: bytes) -> list[Message]:
        self._buf += data
        out: list[Message] = []
        while len(self._buf) >= HEADER.size:
            (n,) = HEADER.unpack_from(self._buf)
            if n > self.limit:
                raise ProtocolError(f"frame of {n} bytes exceeds the {self.limit} limit")
            if len(self._buf) < HEADER.size + n:
                break
            body = bytes(self._buf[HEADER.size : HEADER.size + n])
            del self._buf[: HEADER.size + n]
            out.append(parse(body))
        return out


def parse(body: bytes) -> Message:
    """One frame's JSON object, or ProtocolError (never another exception: a peer's bytes
    must not be able to raise anything else, e.g. RecursionError from deep nesting)."""
    try:
        msg = json.loads(body)
    except (ValueError, RecursionError) as e:
        raise ProtocolError(f"bad JSON frame: {_short(e)}") from None
    if not isinstance(msg, dict):
        raise ProtocolError("a frame must hold a JSON object")
    return msg


def _short(e: Exception) -> str:
    return "nested too deeply" if isinstance(e, RecursionError) else str(e)


# ---- typed messages --------------------------------------------------------------------------
def to_wire(msg: Any, tag: str = "type") -> dict[str, Any]:
    """The JSON object of a message (a dataclass); its `type` under `tag` when it has one."""
    out: dict[str, Any] = {}
    kind = getattr(msg, "type", None)
    if isinstance(kind, str):
        out[tag] = kind
    for f in dataclasses.fields(msg):
        out[f.name] = _plain(getattr(msg, f.name))
    return out


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float)):
        return value
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_wire(value)
    raise TypeError(f"{type(value).__name__} has no wire form")


def from_wire(obj: dict[str, Any], allowed: dict[str, type[Any]], tag: str = "type") -> Any:
    """The message `obj` holds, one of `allowed` (by its `tag` key), checked field by field;
    ProtocolError otherwise."""
    kind = obj.get(tag)
    cls = allowed.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolError(f"unknown message type {_clip(kind)}")
    return _fields(obj, cls, str(kind), skip=tag)


def decode_as(obj: Any, cls: type[Any], where: str = "") -> Any:
    """`obj` as the dataclass `cls` (one with no tag, e.g. a part of a message), checked."""
    if not isinstance(obj, dict):
        raise ProtocolError(f"{where or cls.__name__}: expected an object")
    return _fields(obj, cls, where or cls.__name__, skip=None)


def _fields(obj: dict[str, Any], cls: type[Any], where: str, skip: str | None) -> Any:
    hints, fields = _shape(cls)
    unknown = set(obj) - set(fields) - {skip}
    if unknown:
        raise ProtocolError(f"{where}: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
    values: dict[str, Any] = {}
    for name, f in fields.items():
        if name not in obj:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ProtocolError(f"{where}: missing field {name!r}")
            continue
        values[name] = _check(obj[name], hints[name], f"{where}.{name}")
    return cls(**values)  # a __post_init__ refuses what its types cannot say: ProtocolError


_SHAPES: dict[type[Any], tuple[dict[str, Any], dict[str, dataclasses.Field[Any]]]] = {}


def _shape(cls: type[Any]) -> tuple[dict[str, Any], dict[str, dataclasses.Field[Any]]]:
    """A message class's field types and fields, worked out once: get_type_hints evaluates
    every annotation again at each call, which was most of the cost of a frame."""
    shape = _SHAPES.get(cls)
    if shape is None:
        shape = _SHAPES[cls] = (typing.get_type_hints(cls),
                                {f.name: f for f in dataclasses.fields(cls)})
    return shape


Checker = Callable[[Any, str], Any]
_CHECKERS: dict[Any, Checker] = {}


def _check(value: Any, hint: Any, where: str) -> Any:
    """`value` as type `hint` (the few shapes messages use), or ProtocolError. Each hint's
    check is worked out once (this runs for every field of every frame)."""
    fn = _CHECKERS.get(hint)
    if fn is None:
        fn = _CHECKERS[hint] = _checker(hint)
    return fn(value, where)


def _bad(value: Any, where: str) -> ProtocolError:
    return ProtocolError(f"{where}: unexpected value {_clip(value)}")


def _checker(hint: Any) -> Checker:
    scalar = _SCALARS.get(hint)
    if scalar is not None:
        return scalar
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        return _union(args)
    if origin is Literal:
        def literal(value: Any, where: str) -> Any:
            # By type too: 1 is not True, and "4" is not 4 (kv_bits' choices are numbers).
            if any(type(value) is type(a) and value == a for a in args):
                return value
            raise _bad(value, where)
        return literal
    if origin is list:
        return _list(args[0])
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        items = _list(args[0])
        return lambda value, where: tuple(items(value, where))
    if origin in (dict, Mapping):  # a config's mapping (chat_template_kwargs) arrives a dict
        return _dict(*args)
    if dataclasses.is_dataclass(hint):
        return lambda value, where: _nested(value, hint, where)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        def member(value: Any, where: str) -> Any:
            try:
                return hint(value)
            except ValueError:
                raise _bad(value, where) from None
        return member
    raise TypeError(f"no wire form for {hint!r}")


def _list(item: Any) -> Checker:
    def check(value: Any, where: str) -> Any:
        if not isinstance(value, list):
            raise ProtocolError(f"{where}: expected a list")
        return [_check(v, item, where) for v in value]
    return check


def _dict(key: Any, item: Any) -> Checker:
    def check(value: Any, where: str) -> Any:
        if not isinstance(value, dict):
            raise ProtocolError(f"{where}: expected an object")
        return {_check(k, key, where): _check(v, item, where) for k, v in value.items()}
    return check


def _union(options: tuple[Any, ...]) -> Checker:
    optional = type(None) in options
    rest = tuple(o for o in options if o is not type(None))
    tagged = _tagged(rest) if len(rest) > 1 else None

    def check(value: Any, where: str) -> Any:
        if value is None and optional:
            return None
        if len(rest) == 1:  # an optional field: its one type says what is wrong
            return _check(value, rest[0], where)
        if tagged is not None:
            return _nested(value, tagged, where)
        for option in rest:
            try:
                return _check(value, option, where)
            except ProtocolError:
                continue
        raise _bad(value, where)
    return check


def _tagged(options: tuple[Any, ...]) -> dict[str, type[Any]] | None:
    """A union of tagged messages, by tag (one of them is told by its `type`, not by trial)."""
    if not all(dataclasses.is_dataclass(o) and isinstance(getattr(o, "type", None), str)
               for o in options):
        return None
    return {o.type: o for o in options}


def _nested(value: Any, hint: Any, where: str) -> Any:
    """A message inside a message: tagged (told by its `type`) or a plain part."""
    if isinstance(hint, dict):
        if not isinstance(value, dict):
            raise ProtocolError(f"{where}: expected an object")
        try:
            return from_wire(value, hint)
        except ProtocolError as e:
            raise ProtocolError(f"{where}: {e}") from None
    if isinstance(getattr(hint, "type", None), str):
        return _nested(value, {hint.type: hint}, where)
    return decode_as(value, hint, where)


def _none(value: Any, where: str) -> Any:
    if value is None:
        return None
    raise _bad(value, where)


def _bool(value: Any, where: str) -> Any:
    if isinstance(value, bool):
        return value
    raise _bad(value, where)


def _float(value: Any, where: str) -> Any:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    raise _bad(value, where)


def _int(value: Any, where: str) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise _bad(value, where)


def _str(value: Any, where: str) -> Any:
    if isinstance(value, str):
        return value
    raise _bad(value, where)


def _path(value: Any, where: str) -> Any:
    if isinstance(value, str) and value and "\0" not in value:
        return Path(value)
    raise _bad(value, where)


def _json(value: Any, where: str) -> Any:
    """Any JSON value (a schema, a tool's parameters, as the API checked them): finite numbers,
    string keys, nested at most 1000 deep. Walked without recursion."""
    stack = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if depth > 1000:
            raise ProtocolError(f"{where}: nested too deeply")
        if isinstance(v, dict):
            if not all(isinstance(k, str) for k in v):
                raise _bad(value, where)
            stack.extend((x, depth + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, depth + 1) for x in v)
        elif not (v is None or isinstance(v, (str, int, bool))
                  or (isinstance(v, float) and math.isfinite(v))):
            raise _bad(value, where)
    return value


_SCALARS: dict[Any, Checker] = {type(None): _none, bool: _bool, float: _float, int: _int,
                                str: _str, Path: _path, Any: _json,
                                object: _json}  # the config's JsonValue, Annotated[object, ...]


def _clip(value: Any) -> str:
    return clip(repr(value), 60)
