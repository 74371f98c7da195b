"""How a literal syntax writes JSON values, as Lark: a `Syntax` (Gemma's raw strings between
delimiters, JSON strings without escapes, Python's literals) and the three the formats write
(GEMMA4, FUNCTION_GEMMA, PYTHONIC); the rules of one grammar they are written into (`Grammar`:
shared rules once, free values, bounded numbers); a constant (an enum's value) in a syntax.
"""

from __future__ import annotations

import json
import keyword
import re
from dataclasses import dataclass
from typing import Any

from exod.runner.formats.base import Literal
from exod.runner.formats.grammar_parts import quoted, rx
from exod.runner.serving import json_bounds

DEPTH = json_bounds.ANY_DEPTH  # `$ref`s followed on one path at most, and free values' nesting
KEY_CHARS = json_bounds.KEY_CHARS
_INT = r"-?(?:0|[1-9][0-9]{0,15})"
_FRACTION = rf"(?:\.[0-9]{{1,{json_bounds.FRACTION_DIGITS}}})?"
# A Python string's escapes that mean what JSON's mean (`\/` does not: Python keeps it as it
# is), and no lone surrogate (Python keeps a pair as two characters, JSON joins it).
_PY_ESCAPE = r"""\\(?:["'\\nrtbf]|u(?:[0-9a-cefA-CEF][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2}))"""


# ---- syntaxes ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Syntax:
    """How a literal syntax writes JSON values; Lark expressions throughout. `tag` names the rules
    a grammar shares (strings, free values); `values` is the syntax of an object's values and
    `items` of an array's (None: this one)."""

    tag: str
    colon: str = quoted(":")
    comma: str = quoted(",")
    true: str = quoted("true")
    false: str = quoted("false")
    null: str = quoted("null")
    sort_keys: bool = False  # keys in `dictsort`'s order (case-insensitive)
    objects: bool = True  # whether it writes objects as values at all
    max_items: int | None = None  # items an array holds at most (its parser's limit)
    values: Syntax | None = None
    items: Syntax | None = None

    @property
    def of_values(self) -> Syntax:
        return self.values or self

    @property
    def of_items(self) -> Syntax:
        return self.items or self

    def key(self, g: Grammar, name: str) -> str | None:
        """A named key as Lark; None: one this syntax (its parser) cannot carry."""
        raise NotImplementedError

    def free_key(self, g: Grammar, name: str, named: list[str]) -> str:
        """The terminal `name`: a key beyond `named`, of at most KEY_CHARS characters."""
        raise NotImplementedError

    def string(self, g: Grammar, low: int, high: int | None) -> str:
        """Any string of `low` to `high` characters."""
        raise NotImplementedError

    def text(self, g: Grammar, value: str) -> str | None:
        """The string `value`; None: one it cannot write."""
        raise NotImplementedError


@dataclass(frozen=True)
class Raw(Syntax):
    """Gemma's: a string is its text between two delimiters (a special token each in the model's
    vocabulary, so no escapes), keys bare. `banned`: characters no string may hold (where the
    parser cuts at one); `key_chars`: a regex class of what a bare key is made of."""

    delim: str = ""
    banned: str = ""
    key_chars: str = r"\w"

    def key(self, g: Grammar, name: str) -> str | None:
        return quoted(name) if re.fullmatch(f"{self.key_chars}+", name) else None

    def free_key(self, g: Grammar, name: str, named: list[str]) -> str:
        body = f"/{self.key_chars}{{1,{KEY_CHARS}}}/"
        return g.define(name, _except(body, [quoted(k) for k in named]))

    def string(self, g: Grammar, low: int, high: int | None) -> str:
        d = g.lit(self.delim)
        chars = f"[^{rx(self.banned)}]" if self.banned else "."
        if _special(d):  # text can never hold the token: any text up to it
            body = g.define(f"{self.tag}_STR{_suffix(low, high)}".upper(),
                         f"/(?s:{chars}{_span(low, high)})/")
            return f"{d} {body} {d}"
        # A text delimiter: the string ends at its first occurrence, as the parser cuts it.
        body = g.define(f"{self.tag}_str{_suffix(low, high)}",
                     f"/(?s:{chars}{_span(low, high)}){rx(self.delim)}/", lazy=True)
        return f"{d} {body}"

    def text(self, g: Grammar, value: str) -> str | None:
        if self.delim in value or any(c in value for c in self.banned):
            return None
        d = g.lit(self.delim)
        return f"{d} {quoted(value)} {d}" if value else f"{d} {d}"


@dataclass(frozen=True)
class Json(Syntax):
    """JSON's strings without escapes and without `banned` (FunctionGemma's arrays, which its
    parser reads with json.loads once it has cut them at the first `,` or `}`)."""

    banned: str = ""

    def _chars(self) -> str:
        return f'[^"\\\\\\x00-\\x1f{rx(self.banned)}]'

    def key(self, g: Grammar, name: str) -> str | None:
        return self.text(g, name)

    def free_key(self, g: Grammar, name: str, named: list[str]) -> str:
        body = f'/"{self._chars()}{{0,{KEY_CHARS}}}"/'
        return g.define(name, _except(body, [quoted(json.dumps(k)) for k in named]))

    def string(self, g: Grammar, low: int, high: int | None) -> str:
        return g.define(f"{self.tag}_STR{_suffix(low, high)}".upper(),
                        f'/"{self._chars()}{_span(low, high)}"/')

    def text(self, g: Grammar, value: str) -> str | None:
        if not re.fullmatch(f"{self._chars()}*", value):
            return None
        return quoted(json.dumps(value, ensure_ascii=False))


@dataclass(frozen=True)
class Python(Syntax):
    """Python's literals as mlx-lm's pythonic parser reads them (ast.literal_eval, with JSON's
    true/false/null taken too): strings in either quote with escapes, keys as strings, or as
    bare names (`bare`: a call's keyword arguments)."""

    bare: bool = False

    def key(self, g: Grammar, name: str) -> str | None:
        if not self.bare:
            return self.text(g, name)
        return quoted(name) if name.isidentifier() and not keyword.iskeyword(name) else None

    def free_key(self, g: Grammar, name: str, named: list[str]) -> str:
        if self.bare:
            body = f"/[A-Za-z_][A-Za-z0-9_]{{0,{KEY_CHARS - 1}}}/"
            return g.define(name, _except(body, [quoted(k) for k in (*keyword.kwlist, *named)]))
        shared = self.string(g, 0, KEY_CHARS)
        forms = [quoted(f) for k in named for f in _py_forms(k)]
        return g.define(name, _except(shared, forms))

    def string(self, g: Grammar, low: int, high: int | None) -> str:
        span = _span(low, high)
        body = "|".join(f"{q}(?:[^{q}\\\\\\x00-\\x1f]|{_PY_ESCAPE}){span}{q}" for q in "\"'")
        return g.define(f"{self.tag}_STR{_suffix(low, high)}".upper(), f"/{body}/")

    def text(self, g: Grammar, value: str) -> str | None:
        return "(" + " | ".join(quoted(f) for f in _py_forms(value)) + ")"


def _py_forms(value: str) -> list[str]:
    """A string as JSON writes it and as Python's repr does (both are Python literals)."""
    return list(dict.fromkeys((json.dumps(value, ensure_ascii=False), repr(value))))


# Gemma 4: `key:value` sorted at every level, strings between `<|"|>`, null as Jinja prints
# Python's None (the template's `{{ argument }}`; Gemma4.parse reads it).
GEMMA4 = Raw("g4", null=quoted("None"), sort_keys=True, delim='<|"|>')
# FunctionGemma, as mlx-lm's parser reads it: the call ends at the first `}` (no objects, no
# `}` in a string), a value other than a string ends at the first `,` (arrays of one item at
# most, read as JSON), a key at the first `:`. Sorted, as Gemma's templates write keys.
_FUNCTION_GEMMA_ITEMS = Json("fgj", objects=False, max_items=1, banned=",}")
FUNCTION_GEMMA = Raw("fg", sort_keys=True, objects=False, max_items=1,
                     items=_FUNCTION_GEMMA_ITEMS, delim="<escape>", banned="}",
                     key_chars="[^:{},]")
# LFM2: `name(key=value, ...)`; inside, dicts as JSON (`tojson`) or Python's repr writes them,
# `, ` and `: ` between their parts; the literals of both.
_TRUE, _FALSE, _NULL = '("True" | "true")', '("False" | "false")', '("None" | "null")'
_PYTHON_VALUES = Python("py", colon=quoted(": "), comma=quoted(", "), true=_TRUE, false=_FALSE,
                        null=_NULL)
PYTHONIC = Python("pyk", colon=quoted("="), comma=quoted(", "), true=_TRUE, false=_FALSE,
                  null=_NULL, bare=True, values=_PYTHON_VALUES, items=_PYTHON_VALUES)


# ---- the rules of one grammar ------------------------------------------------------------------
class Grammar:
    """The rules of one grammar, the shared ones once; `lit`: a marker as Lark."""

    def __init__(self, lit: Literal) -> None:
        self.lit = lit
        self.rules: dict[str, str] = {}

    def define(self, name: str, body: str, lazy: bool = False) -> str:
        if name not in self.rules:
            self.rules[name] = f"{name}{'[lazy]' if lazy else ''}: {body}\n"
        return name

    def text(self) -> str:
        return "".join(self.rules.values())

    def number(self, integer: bool) -> str:
        """A number within json_bounds' default bounds: 16 integral digits, 10 fraction ones."""
        if integer:
            return self.define("LIT_INT", f"/{_INT}/")
        return self.define("LIT_NUM", f"/{_INT}{_FRACTION}/")

    def free(self, syn: Syntax, level: int = DEPTH) -> str:
        """Any JSON value the syntax writes, `level` containers deep at most."""
        name = f"{syn.tag}_any{level}"
        if name in self.rules:
            return name
        if level == 0:
            return self.define(name, " | ".join((syn.string(self, 0, None), self.number(False),
                                                 syn.true, syn.false, syn.null)))
        alts = [self.free(syn, 0)]
        if syn.max_items != 0:
            item = self.free(syn.of_items, level - 1)
            more = rep(f"({syn.comma} {item})", 0,
                       None if syn.max_items is None else syn.max_items - 1)
            alts.append(f'"[" ({item} {more})? "]"')
        if syn.objects:
            key = syn.free_key(self, f"{syn.tag.upper()}_KEY", [])
            member = f"{key} {syn.colon} {self.free(syn.of_values, level - 1)}"
            alts.append(f'"{{" ({member} ({syn.comma} {member})*)? "}}"')
        return self.define(name, " | ".join(alts))


# ---- a constant in a syntax, and helpers -------------------------------------------------------
def constant(g: Grammar, v: Any, syn: Syntax) -> str | None:
    """A JSON value (an enum's, a const) as the syntax writes it; None: one it cannot."""
    if v is None:
        return syn.null
    if isinstance(v, bool):
        return syn.true if v else syn.false
    if isinstance(v, (int, float)):
        return quoted(json.dumps(v))
    if isinstance(v, str):
        return syn.text(g, v)
    if isinstance(v, list):
        if syn.max_items is not None and len(v) > syn.max_items:
            return None
        items = [constant(g, x, syn.of_items) for x in v]
        if any(x is None for x in items):
            return None
        return '"[" ' + f" {syn.comma} ".join(x for x in items if x) + (' "]"' if v else '"]"')
    if isinstance(v, dict):
        if not syn.objects:
            return None
        keys = sorted(v, key=str.lower) if syn.sort_keys else list(v)
        parts = []
        for k in keys:
            key, value = syn.key(g, k), constant(g, v[k], syn.of_values)
            if key is None or value is None:
                return None
            parts.append(f"{key} {syn.colon} {value}")
        return '"{" ' + f" {syn.comma} ".join(parts) + (' "}"' if parts else '"}"')
    return None


def rep(expr: str, low: int, high: int | None) -> str:
    """`expr` `low` to `high` times (None: no end); "" for none at all."""
    if high == 0:
        return ""
    if high is None:
        return f"{expr}*" if low == 0 else f"{expr}+" if low == 1 else f"{expr}{{{low},}}"
    return f"{expr}{{{low}}}" if low == high else f"{expr}{{{low},{high}}}"


def _span(low: int, high: int | None) -> str:
    if high is None:
        return "*" if low == 0 else f"{{{low},}}"
    return f"{{{low},{high}}}"


def _suffix(low: int, high: int | None) -> str:
    return f"_{low}_{'n' if high is None else high}"


def _except(body: str, literals: list[str]) -> str:
    """A terminal: `body`, but none of `literals` (Lark strings)."""
    return f"{body} & ~({' | '.join(literals)})" if literals else body


def _special(lark: str) -> bool:
    """Whether a marker, as `lit` wrote it, is a special token (`<[id]>`), never text."""
    return lark.startswith("<")
