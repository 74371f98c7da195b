"""The field policy: what exod does with each field a request body may hold, as data.

Every field path of every dialect is in one class (`Support`): it works; it is accepted and
cannot change the answer (ids, metadata, caching hints); it names something exod does not
run and is ignored and reported (a hosted tool a client attaches by default); or it would
change the answer and exod cannot do it, so it is refused by name (a value that asks for
nothing still passes). A field in no table (new client versions keep adding them) is ignored
and reported too, or refused by name under `api.strict_fields`.

A dialect is a `Dialect`: its objects (each object's keys, with their class and what exod does)
and its variants (the values of a `type` key that pick an object's kind). Its mapping module
reads a body with a `Reading`, which checks each object's keys and each variant against the
table and collects what was ignored, for the response header and /metrics
(exod.api.ignored). The docs' field tables are rendered from the same tables
(tests.field_docs). The tables themselves sit with their dialects (exod.api.dialects). Pure
data and logic: no I/O.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from exod.core import request_rules as rules
from exod.core.images import Pictures, Source
from exod.core.request_rules import RequestError

Check = Callable[[Any], bool]  # true when a value asks for nothing (a refused field passes)
# Reads one picture's part of a content (the part, where it is) into its source.
ImageReader = Callable[[dict[str, Any], str], Source]
MAX_KEY = 64  # characters of an unknown key kept in names and errors


class Support(str, enum.Enum):
    WORKS = "works"
    INERT = "accepted, no effect"
    IGNORED = "ignored, reported"
    REFUSED = "refused"


# ---- values that ask for nothing --------------------------------------------------------------
def never(value: Any) -> bool:
    return False


def null(value: Any) -> bool:
    return value is None


def empty(value: Any) -> bool:
    return value is None or (not isinstance(value, bool) and value in ("", [], {}))


def false(value: Any) -> bool:
    return value is None or value is False


@dataclass(frozen=True)
class Field:
    kind: Support
    doc: str = ""  # what exod does with it, for the docs table
    ok: Check = never  # REFUSED: the values that ask for nothing, which pass
    why: str = ""  # REFUSED: the reason, in the error


def works(doc: str) -> Field:
    return Field(Support.WORKS, doc)


def inert(doc: str) -> Field:
    return Field(Support.INERT, doc)


def ignored(doc: str) -> Field:
    return Field(Support.IGNORED, doc)


def refused(why: str, ok: Check = never, doc: str = "") -> Field:
    """`why` completes "`field`: ..." in the error; `doc` (default: `why`) is the table's."""
    return Field(Support.REFUSED, doc or why, ok, why)


@dataclass(frozen=True)
class Obj:
    """An object of a request: where it sits (`messages[].content[]`) and its keys."""

    path: str
    keys: Mapping[str, Field]
    title: str = ""  # for the docs, when the path alone does not say which object it is


@dataclass(frozen=True)
class Variants:
    """The values of an object's discriminating key (`type`), each in its class. A value
    ending in `*` covers every value that starts with the rest (dated tool versions)."""

    path: str  # where the key sits: `tools[].type`
    values: Mapping[str, Field]

    def get(self, value: str) -> Field | None:
        row = self.values.get(value)
        if row is not None:
            return row
        return next((r for v, r in self.values.items()
                     if v.endswith("*") and value.startswith(v[:-1])), None)


@dataclass(frozen=True)
class Dialect:
    name: str  # as /metrics labels it: chat, completion, messages, responses
    title: str  # the endpoint, for the docs
    objects: Mapping[str, Obj]
    variants: Mapping[str, Variants] = field(default_factory=dict)
    intro: str = ""  # a paragraph before the table, for the docs


def template(param: str) -> str:
    """A field's path without its indexes (`messages[].content[].x`): what is logged and
    counted, so that one field is one name however many times a body holds it."""
    return re.sub(r"\[\d+\]", "[]", param)


class Reading:
    """One body being read against its dialect's table: refuses what must be refused, and
    collects the names of the fields it ignored (in order, each once)."""

    def __init__(self, dialect: Dialect, strict: bool = False) -> None:
        self.dialect = dialect
        self.strict = strict
        self._ignored: dict[str, None] = {}

    @property
    def ignored(self) -> tuple[str, ...]:
        return tuple(self._ignored)

    def ignore(self, param: str) -> None:
        self._ignored.setdefault(template(param))

    def keys(self, raw: Mapping[str, Any], kind: str, param: str = "") -> None:
        """Every key of one object (`kind`, at `param`) against its table."""
        keys = self.dialect.objects[kind].keys
        for key, value in raw.items():
            where = f"{param}.{str(key)[:MAX_KEY]}" if param else str(key)[:MAX_KEY]
            row = keys.get(key)
            if row is None:
                self.unknown(where)
            elif row.kind is Support.REFUSED and not row.ok(value):
                raise RequestError(f"`{where}`: {row.why}", where)
            elif row.kind is Support.IGNORED and not (empty(value) or value is False):
                self.ignore(where)

    def variant(self, value: Any, kind: str, param: str, key: str = "type") -> bool:
        """Whether the object at `param`, whose `key` is `value`, is one exod reads (with
        `key` "": whether the value at `param` is): False when it is ignored (reported) or has
        no effect; a refused one is a RequestError."""
        where = f"{param}.{key}" if key else param
        if not isinstance(value, str):
            raise RequestError(f"`{where}` must be a string", where)
        row = self.dialect.variants[kind].get(value)
        if row is None:
            self.unknown(where, value)
        elif row.kind is Support.REFUSED and not row.ok(value):
            raise RequestError(f"`{where}` {value[:MAX_KEY]!r}: {row.why}", where)
        elif row.kind is Support.IGNORED:
            self.ignore(f"{where}={value[:MAX_KEY]}")
        return row is not None and row.kind is Support.WORKS

    def items(self, raw: Any, param: str, kind: str, what: str, most: int | None = None,
              default: str | None = None) -> Iterator[tuple[dict[str, Any], str]]:
        """The objects of an array (`what` each: "tool") whose type (`default` when absent)
        exod reads, with where each is (`tools[3]`); the others ignored or refused."""
        for i, item in enumerate(rules.array(raw, param, most, what=f"{what}s")):
            where = f"{param}[{i}]"
            rules.obj(item, where, f"{'an' if what[0] in 'aeiou' else 'a'} {what}")
            if self.variant(item.get("type", default), kind, where):
                yield item, where

    def texts(self, raw: Any, param: str, kind: str, obj: str) -> list[str]:
        """The text of the text parts of an array (their types: variants `kind`, their keys:
        object `obj`)."""
        return [p["text"] for p in self.content(raw, param, kind, obj)]

    def content(self, raw: Any, param: str, kind: str, obj: str,
                pictures: Pictures | None = None,
                images: Mapping[str, ImageReader] | None = None) -> list[dict[str, Any]]:
        """The parts of an array that exod reads (their types: variants `kind`), in order: text
        parts (their keys: object `obj`), and the pictures (a type in `images`, read by its
        reader), each placed by `pictures` (exod.core.images)."""
        out = []
        for part, where in self.items(raw, param, kind, "content part"):
            read = (images or {}).get(part["type"])
            if read is not None and pictures is not None:
                out.append(pictures.add(replace(read(part, where), where=where)))
                continue
            self.keys(part, obj, where)
            out.append({"type": "text",
                        "text": rules.text_field(part.get("text"), f"{where}.text")})
        return out

    def unknown(self, where: str, value: str | None = None) -> None:
        """A field (or, with `value`, the value of a field that picks an object's kind) in no
        table: ignored and reported, or refused under api.strict_fields."""
        if self.strict:
            what = f"`{where}`" if value is None else f"`{where}` {value[:MAX_KEY]!r}"
            raise RequestError(f"{what} is not a field exod knows (api.strict_fields refuses "
                               "what exod does not know)", where)
        self.ignore(where if value is None else f"{where}={value[:MAX_KEY]}")
