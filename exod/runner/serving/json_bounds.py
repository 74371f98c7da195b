"""The JSON a grammar lets a model write, bounded where the client's schema sets no end: every
grammar exod builds from a JSON schema (response_format, forced tool calls, the answer after a
thinking block, the check of a strict tool's call) is made here, from `bounded(schema)` and
`options(strict)`.

Agent libraries make schemas from code (pydantic's `model_json_schema()`, LangChain's tool
schemas, instructor's response models) that rarely close their objects or bound their numbers,
and on such a schema a degenerate model (a small quantized one, a random one) wrote keys the
schema never named, or integers of 200 digits, until `max_tokens` cut the answer as invalid
JSON. `bounded` rewrites a schema so that this cannot happen, keeping every document it allows
valid against the client's own schema: no key or tuple item beyond those named unless the schema
allows more, numbers of bounded digits, free values of bounded depth, no whitespace. Strings and
arrays without a bound are still ended by the model. Each bound and its reason: docs/tools.md,
"Bounds where the schema sets none". Pure: no engine, no mlx; unit-tested on its own.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

INT_BOUND = 10 ** 16  # 16 integral digits (10^16 itself has 17, the one exception)
FRACTION_DIGITS = 10  # not llama.cpp's 16: the engine reads a multipleOf past 10^-10 wrongly
KEY_CHARS = 256
ANY_DEPTH = 16
FORMAT_CHARS = {"date-time": 35, "time": 24, "duration": 32}  # nanoseconds and an offset
ANY = "exod_any"  # the prefix of the definitions `bounded` adds ($defs/exod_any_<depth>)
MAX_NESTING = 200  # schema levels walked: deeper ones are left as they are (the engine refuses)

# Keywords that only annotate: a schema made of these alone allows any value.
_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment",
                          "deprecated", "readOnly", "writeOnly", "$schema", "$id", "$anchor",
                          "x-guidance"})
_OBJECT_KEYWORDS = ("properties", "patternProperties", "additionalProperties", "required",
                    "minProperties", "maxProperties")
_MERGING = ("allOf", "anyOf", "oneOf", "$ref")
_DEFINITIONS = ("$defs", "definitions")
JSON_OBJECT = {"type": "object", "additionalProperties": True}  # `json_object`: any object
_FREE = {"$ref": f"#/$defs/{ANY}_{ANY_DEPTH}"}
_KEY = f"^(?s:.){{0,{KEY_CHARS}}}$"  # a key of at most KEY_CHARS characters
_LONG_KEY = f"^(?s:.){{{KEY_CHARS + 1},}}$"  # one of more


def options(strict: bool) -> JsonCompileOptions:
    """The engine's JSON options (llguidance's `x-guidance`): compact JSON, no whitespace between
    tokens (else a model, above all a random one, may write whitespace forever between two
    values); `lenient`: keywords the engine does not implement are left out, unless `strict`."""
    return {"whitespace_flexible": False, "lenient": not strict}


def json_rule(schema: Any, strict: bool) -> str:
    """`schema`, bounded, as the body of a Lark rule (llguidance's `%json`)."""
    inline = bounded(schema)
    if isinstance(inline, dict):
        inline = {**inline, "x-guidance": options(strict)}
    return f"%json {json.dumps(inline, ensure_ascii=False)}"


def bounded(schema: Any) -> Any:
    """`schema` with the bounds the module's docstring lists, as a new schema (the argument is
    left as it is). Every document it allows is valid against `schema`."""
    b = _Bounder(_merged_paths(schema))
    out = b.walk(schema, (), False, 0)
    if not b.any_used or not isinstance(out, dict):
        return out
    # The free values' definitions, beside the schema's own (a `$defs` that is no mapping
    # held nothing a `$ref` could reach).
    own = out["$defs"] if isinstance(out.get("$defs"), dict) else {}
    return {**out, "$defs": {**own, **_any_definitions()}}


def pointer(root: Any, ref: str) -> Any:
    """What a local `$ref` ("#/$defs/A") points to in `root`; None if nothing."""
    path = _ref_path(ref)
    return None if path is None else _at(root, path)


def is_free(schema: Any) -> bool:
    """Whether `schema` allows any JSON value (`true`, or only annotations)."""
    return schema is True or (isinstance(schema, dict) and _ANNOTATIONS.issuperset(schema))


# ---- inside ------------------------------------------------------------------------------------
def _types(schema: dict[str, Any]) -> set[str] | None:
    t = schema.get("type")
    if isinstance(t, str):
        return {t}
    if isinstance(t, list):
        return {x for x in t if isinstance(x, str)}
    return None


def _is_object(schema: dict[str, Any]) -> bool:
    types = _types(schema)
    if types is not None:
        return "object" in types
    return any(k in schema for k in _OBJECT_KEYWORDS)


def _has_own_object_keywords(schema: dict[str, Any]) -> bool:
    return any(k in schema for k in _OBJECT_KEYWORDS)


def _members(schema: dict[str, Any], key: str) -> list[Any]:
    v = schema.get(key)
    return v if isinstance(v, list) else []


def _members_partial(schema: dict[str, Any], key: str) -> bool:
    """Whether the members of `schema[key]` are merged with something else: then none may be
    closed on its own (its additionalProperties would forbid the others' keys)."""
    if key == "allOf":
        return len(_members(schema, key)) > 1 or _has_own_object_keywords(schema)
    return _has_own_object_keywords(schema)


def _ref_path(ref: Any) -> tuple[str, ...] | None:
    if not isinstance(ref, str) or not ref.startswith("#"):
        return None
    parts = ref[1:].split("/")[1:] if ref != "#" else []
    return tuple(p.replace("~1", "/").replace("~0", "~") for p in parts)


Child = tuple[tuple[str, ...], Any, bool]  # (path below its parent, subschema, merged)


def _children(schema: dict[str, Any], partial: bool) -> list[Child]:
    """The subschemas of `schema`, each with its path below it and whether it is merged with
    others (see `_members_partial`)."""
    out: list[Child] = []
    for key in ("properties", "patternProperties", *_DEFINITIONS):
        sub = schema.get(key)
        if isinstance(sub, dict):
            out += [((key, k), v, False) for k, v in sub.items()]
    for key in ("additionalProperties", "additionalItems", "items"):
        if isinstance(schema.get(key), dict):
            out.append(((key,), schema[key], False))
    for key in ("items", "prefixItems"):  # arrays of schemas (draft 4's tuple `items`)
        if isinstance(schema.get(key), list):
            out += [((key, str(i)), v, False) for i, v in enumerate(schema[key])]
    for key in ("allOf", "anyOf", "oneOf"):
        inner = partial or _members_partial(schema, key)
        out += [((key, str(i)), v, inner) for i, v in enumerate(_members(schema, key))]
    return out


def _merged_paths(root: Any) -> set[tuple[str, ...]]:
    """The paths of the subschemas that are merged with others (see `_members_partial`),
    followed through local `$ref`s: a definition reached from such a place is merged too."""
    merged: set[tuple[str, ...]] = set()
    todo: list[tuple[Any, tuple[str, ...], bool, int]] = [(root, (), False, 0)]
    seen: set[tuple[tuple[str, ...], bool]] = set()
    while todo:
        node, path, partial, depth = todo.pop()
        if not isinstance(node, dict) or (path, partial) in seen or depth > MAX_NESTING:
            continue
        seen.add((path, partial))
        if partial:
            merged.add(path)
        target = _ref_path(node.get("$ref"))
        if target is not None and (partial or _has_own_object_keywords(node)) \
                and (target, True) not in seen:
            todo.append((_at(root, target), target, True, depth + 1))
        todo += [(c, (*path, *rel), part, depth + 1) for rel, c, part in _children(node, partial)]
    return merged


def _at(root: Any, path: tuple[str, ...]) -> Any:
    node = root
    for part in path:
        if isinstance(node, dict):
            node = node.get(part)
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


class _Bounder:
    def __init__(self, merged: set[tuple[str, ...]]) -> None:
        self.merged = merged
        self.any_used = False

    def free(self) -> dict[str, Any]:
        self.any_used = True
        return dict(_FREE)

    def walk(self, node: Any, path: tuple[str, ...], partial: bool, depth: int) -> Any:
        """`node` (at `path`), bounded; `partial`: it is merged with other schemas."""
        if is_free(node) and not partial:
            return self.free()
        if not isinstance(node, dict) or depth > MAX_NESTING:
            return node
        partial = partial or path in self.merged
        out = {k: dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v
               for k, v in node.items()}  # containers copied: the argument stays as it is
        for rel, child, inner in _children(node, partial):
            done = self.walk(child, (*path, *rel), inner, depth + 1)
            holder = out[rel[0]]
            if len(rel) == 1:
                out[rel[0]] = done
            elif isinstance(holder, list):
                holder[int(rel[1])] = done
            else:
                holder[rel[1]] = done
        if "const" in node or "enum" in node:
            return out  # its values are listed: nothing to bound
        types = _types(node)
        if types is not None and types & {"integer", "number"}:
            _bound_number(out, "number" in types)
        if types is not None and "string" in types:
            fmt = node.get("format")
            if isinstance(fmt, str) and fmt in FORMAT_CHARS and "maxLength" not in node:
                out["maxLength"] = max(FORMAT_CHARS[fmt], _int(node.get("minLength")))
        if (types is not None and "array" in types) or "prefixItems" in node \
                or isinstance(node.get("items"), list):
            self._bound_array(out)
        if _is_object(node):
            self._bound_object(out, partial)
        return out

    def _bound_array(self, out: dict[str, Any]) -> None:
        if isinstance(out.get("prefixItems"), list):
            out.setdefault("items", False)  # no item past those listed
        elif isinstance(out.get("items"), list):
            out.setdefault("additionalItems", False)
        elif out.get("items", True) is True:  # absent or true: any item
            out["items"] = self.free()

    def _bound_object(self, out: dict[str, Any], partial: bool) -> None:
        props: dict[str, Any] = out["properties"] \
            if isinstance(out.get("properties"), dict) else {}
        if "additionalProperties" not in out and "unevaluatedProperties" not in out:
            if partial or not self._closable(out):
                return
            named = [k for k in _members(out, "required") if isinstance(k, str)
                     and k not in props]
            if named:  # required but not described: any value, as the schema allows
                out["properties"] = {**props, **{k: self.free() for k in named}}
            out["additionalProperties"] = False
            return
        extra = out.get("additionalProperties")
        if extra is True:
            extra = out["additionalProperties"] = self.free()
        if not isinstance(extra, dict) or "patternProperties" in out \
                or any(len(k) > KEY_CHARS for k in props):
            return  # a schema's own patternProperties must stay disjoint: left alone
        if not props or extra == _FREE:
            # Extra keys of bounded length, written as the engine quotes them. The pattern
            # applies to the named keys too: harmless when the values it allows are free.
            out["patternProperties"] = {_KEY: extra}
            out["additionalProperties"] = False
        else:
            # Longer keys match this and may take no value. Less tight (the engine checks it on
            # the key as written: \u escapes of what it would write plainly slip through).
            out["patternProperties"] = {_LONG_KEY: False}

    def _closable(self, out: dict[str, Any]) -> bool:
        """An object merged with members of its own (allOf, anyOf, oneOf, $ref) is closed only
        when none of them names keys: closing it would forbid theirs."""
        for key in _MERGING:
            if key not in out:
                continue
            if key == "$ref":
                return False
            for m in _members(out, key):
                if isinstance(m, dict) and any(k in m for k in (*_OBJECT_KEYWORDS[:3], *_MERGING)):
                    return False
        return True


def _bound_number(out: dict[str, Any], fractional: bool) -> None:
    low = _number(out.get("minimum"), out.get("exclusiveMinimum"))
    high = _number(out.get("maximum"), out.get("exclusiveMaximum"))
    if low is None and (high is None or high >= -INT_BOUND):
        out["minimum"] = -INT_BOUND
    if high is None and (low is None or low <= INT_BOUND):
        out["maximum"] = INT_BOUND
    if fractional and "multipleOf" not in out:
        out["multipleOf"] = float(f"1e-{FRACTION_DIGITS}")  # the literal: its exact bits count


def _number(*values: Any) -> float | None:
    found = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return found[0] if found else None


def _int(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def _any_definitions() -> dict[str, Any]:
    """Any JSON value, ANY_DEPTH containers deep at most: level 0 holds scalars only, level k
    arrays and objects of level k - 1. Numbers bounded, keys at most KEY_CHARS characters."""
    scalar: dict[str, Any] = {"type": ["null", "boolean", "number", "string"]}
    _bound_number(scalar, True)
    defs: dict[str, Any] = {f"{ANY}_0": scalar}
    for k in range(1, ANY_DEPTH + 1):
        inner = {"$ref": f"#/$defs/{ANY}_{k - 1}"}
        level: dict[str, Any] = {"type": ["null", "boolean", "number", "string", "array",
                                          "object"]}
        _bound_number(level, True)
        level["items"] = inner
        level["patternProperties"] = {_KEY: inner}
        level["additionalProperties"] = False
        defs[f"{ANY}_{k}"] = level
    return defs
