"""The three formats that write a call's arguments in a literal syntax: Gemma 4's and
FunctionGemma's (`call:NAME{...}` between their markers, one call after another) and the pythonic
one (LFM2: every call of the turn in one list). Each gives a call's head and closing; the
converter (exod.runner.formats.literals.writer) writes the arguments between them.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from exod.core.request_rules import RequestError
from exod.runner.formats.base import Allowed, Literal, ParsedCall, ToolFormat
from exod.runner.formats.grammar_parts import choice, quoted, repeat
from exod.runner.formats.literals.syntax import FUNCTION_GEMMA, GEMMA4, PYTHONIC, Grammar, Syntax
from exod.runner.formats.literals.writer import Writer


def _named(fn: dict[str, Any], ok: Callable[[str], bool], kind: str) -> str:
    """A tool's name, if the format's parser reads it back: else the request's error."""
    name = fn["name"]
    if not ok(name):
        raise RequestError(f"`tools`: {name!r} is not a name this model's call format "
                           f"({kind}) can write", "tools")
    return str(name)


def _calls(allowed: Allowed, lit: Literal, syn: Syntax, kind: str,
           head: Callable[[dict[str, Any]], tuple[str, str]]) -> str:
    """`call_body`: one call of any allowed tool, `head(fn)` (Lark) before its arguments and
    the closing after; then the converter's rules."""
    g = Grammar(lit)

    def fn(i: int, f: dict[str, Any]) -> list[str]:
        opening, closing = head(f)
        body = Writer(g, i, f, f["name"] in allowed.strict, kind).arguments(syn)
        return [f"fn_{i}: {' '.join(x for x in (opening, body, closing) if x)}\n"]
    return "".join(choice(allowed, fn)) + g.text()


_NONE = re.compile(r"(?<=[:\[,])None(?=[,}\]])")


@dataclass(frozen=True)
class Gemma4(ToolFormat):
    """`<|tool_call>call:NAME{key:VALUE,...}<tool_call|>`, one after another: keys bare and
    sorted, strings between `<|"|>` tokens, as Gemma 4's template `format_argument` writes."""

    def grammar(self, allowed: Allowed, lit: Literal, top: str) -> str:
        def head(f: dict[str, Any]) -> tuple[str, str]:
            name = _named(f, lambda n: re.fullmatch(r"[\w-]+", n) is not None, self.kind)
            return quoted(f"call:{name}{{"), quoted("}")
        return (f"{top}: {repeat('call', '', allowed.most)}\n"
                f"call: {lit(self.start)} call_body {lit(self.end)}\n"
                + _calls(allowed, lit, GEMMA4, self.kind, head))

    def parse(self, body: str, tools: Any) -> list[ParsedCall]:
        """mlx-lm's parser, and the template's null: Jinja prints None as `None`, which that
        parser's JSON does not read; outside strings it is read as null."""
        try:
            return super().parse(body, tools)
        except ValueError:
            parts = body.split('<|"|>')
            fixed = '<|"|>'.join(_NONE.sub("null", p) if i % 2 == 0 else p
                                 for i, p in enumerate(parts))
            if fixed == body:
                raise
            return super().parse(fixed, tools)


@dataclass(frozen=True)
class FunctionGemma(ToolFormat):
    """`<start_function_call>call:NAME{key:<escape>text<escape>,n:1}<end_function_call>`, one
    after another, as mlx-lm's parser reads it (see FUNCTION_GEMMA for what it cannot carry)."""

    def grammar(self, allowed: Allowed, lit: Literal, top: str) -> str:
        def head(f: dict[str, Any]) -> tuple[str, str]:
            name = _named(f, lambda n: re.fullmatch(r"\w+", n) is not None, self.kind)
            return quoted(f"call:{name}{{"), quoted("}")
        return (f"{top}: {repeat('call', '', allowed.most)}\n"
                f"call: {lit(self.start)} call_body {lit(self.end)}\n"
                + _calls(allowed, lit, FUNCTION_GEMMA, self.kind, head))


def _python_name(name: str) -> bool:
    return all(p.isidentifier() and not keyword.iskeyword(p) for p in name.split("."))


@dataclass(frozen=True)
class Pythonic(ToolFormat):
    """`<|tool_call_start|>[NAME(key="text", n=1), ...]<|tool_call_end|>`: every call of the
    turn in one list, arguments as Python keyword arguments (LFM2)."""

    def grammar(self, allowed: Allowed, lit: Literal, top: str) -> str:
        def head(f: dict[str, Any]) -> tuple[str, str]:
            return quoted(f"{_named(f, _python_name, self.kind)}("), quoted(")")
        calls = repeat("call_body", quoted(", "), allowed.most)
        return (f'{top}: {lit(self.start)} "[" {calls} "]" {lit(self.end)}\n'
                + _calls(allowed, lit, PYTHONIC, self.kind, head))
