"""`Tagged`: what the formats that write a call parameter by parameter between tags share. A
call is an opening with its name, its parameters (each an opening with its key, the value, a
closing tag) and a closing, the calls of a turn in a block; a subclass gives the pieces, and
reads its calls back (`Tagged.read`) so that each value is read by the tool's schema.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

from exod.core.request_rules import RequestError
from exod.runner.formats.base import Allowed, Literal, ParsedCall, ToolFormat, calls_of
from exod.runner.formats.grammar_parts import Param, choice, json_value, params, quoted, rx
from exod.runner.formats.tagged.values import (BOOL, TEXT, read_value, resolved, text_keys,
                                               written_as)

Found = list[tuple[str, list[tuple[str, str]]]]  # calls read: (name, [(key, value's text)])


def text_span(schema: Any) -> tuple[int, str]:
    """A string's minLength, and a regex repetition for it and its maxLength."""
    s = schema if isinstance(schema, dict) else {}
    low, high = s.get("minLength"), s.get("maxLength")
    low = low if isinstance(low, int) and low > 0 else 0
    if isinstance(high, int) and high >= low:
        return low, f"{{{low},{high}}}"
    return low, f"{{{low},}}" if low else "*"


def rx_text(text: str) -> str:
    """`text` as itself in a regex, a newline written `\\n`."""
    return rx(text).replace("\n", "\\n")


@dataclass(frozen=True)
class Tagged(ToolFormat):
    """What the formats share: a call is an opening with its name, its parameters (each an
    opening with its key, the value, the closing tag `shut`), and a closing; the calls of a
    turn are written in a block (`block`). Subclasses give the pieces as Lark."""

    SHUT: ClassVar[str] = ""  # the text that closes a value (a tag, maybe a special token)
    bad_key: ClassVar[str] = r'[<>"]'  # characters a key cannot hold in the format's tags
    python_bools: ClassVar[bool] = False  # booleans as `True`/`False`

    @property
    def shut(self) -> str:
        return self.SHUT

    # -- the pieces (Lark) --
    def block(self, allowed: Allowed, lit: Literal, top: str) -> str:
        """Rule `top`: up to `allowed.most` calls, each a `call_body`."""
        raise NotImplementedError

    def opening(self, name: str, lit: Literal) -> str:
        raise NotImplementedError

    def closing(self, lit: Literal) -> str:
        raise NotImplementedError

    def key(self, p: Param, lit: Literal) -> str:
        """A parameter's opening."""
        raise NotImplementedError

    def after(self, lit: Literal) -> str:
        """What follows a parameter's closing tag."""
        return ""

    def cuts(self) -> tuple[str, ...]:
        """Texts a raw value must not hold: where the format's parser (or the splitter) would
        end it."""
        return (self.shut, self.end) if self.end else (self.shut,)

    def plain(self, text: str) -> str:
        """A string value as the template writes it (MiniCPM5 wraps some in CDATA)."""
        return text

    # -- the grammar --
    def grammar(self, allowed: Allowed, lit: Literal, top: str) -> str:
        def fn(i: int, f: dict[str, Any]) -> list[str]:
            rules, body = self.arguments(i, f, allowed, lit)
            return [f"fn_{i}: {self.opening(f['name'], lit)} {body} {self.closing(lit)}\n",
                    *rules]
        return self.block(allowed, lit, top) + "".join(choice(allowed, fn))

    def arguments(self, i: int, fn: dict[str, Any], allowed: Allowed,
                  lit: Literal) -> tuple[list[str], str]:
        """The rules of tool `i`'s parameters, and their sequence (Lark): in the schema's
        order, the required ones always, the others maybe."""
        strict = fn["name"] in allowed.strict
        rules: list[str] = []
        seq: list[str] = []
        for j, p in enumerate(params(fn)):
            if self.bad_key and re.search(self.bad_key, p.name):
                raise RequestError(f"`tools`: {fn['name']!r} has a parameter named "
                                   f"{p.name!r}, which this model's call format cannot write",
                                   "tools")
            rule, value = f"p_{i}_{j}", f"v_{i}_{j}"
            rules.append(f"{rule}: {self.key(p, lit)} {value} {self.after(lit)}\n")
            how, by = written_as(p, strict, fn["name"])
            rules += self.value(value, by, how, strict, lit)
            seq.append(rule if p.required else f"{rule}?")
        return rules, " ".join(seq)

    def value(self, rule: str, p: Param, how: str, strict: bool, lit: Literal) -> list[str]:
        """Rule `rule`: a parameter's value, then its closing tag."""
        close = lit(self.shut)
        if how == TEXT:
            return self.text(rule, p, close)
        if how == BOOL and self.python_bools:
            return [f'{rule}: ("True" | "False") {close}\n']
        return [f"{rule}: {rule}_json {close}\n", f"{rule}_json: {json_value(p, strict)}\n"]

    def text(self, rule: str, p: Param, close: str) -> list[str]:
        """A string's value as raw text that holds none of `cuts()`. Before a special token
        the text simply ends there; before a text closer the lexeme is lazy: it ends at the
        closer's first occurrence, as the parser cuts it."""
        values = Param(p.name, resolved(p.schema), p.required).enum
        if values is not None:
            return [f"{rule}: ({' | '.join(quoted(self.plain(v)) for v in values)}) {close}\n"]
        span, term = text_span(resolved(p.schema))[1], rule.upper()
        never = "|".join(rx_text(c) for c in self.cuts())
        if close.startswith("<["):
            return [f"{rule}: {term} {close}\n",
                    f"{term}: /(?s:.{span})/ & ~/(?s:.*)({never})(?s:.*)/\n"]
        end = rx_text(self.shut)  # no cut before the closer (which may hold one: `<|close|>`)
        return [f"{rule}[lazy]: {term}\n",
                f"{term}: /(?s:.{span}){end}/ & ~/(?s:.*)({never})(?s:.*){end}/\n"]

    # -- parsing --
    def parse(self, body: str, tools: Any) -> list[ParsedCall]:
        found = self.read(body)
        if not found:  # a shape of its own: mlx-lm's parser reads those
            return super().parse(body, tools)
        out = []
        for name, pairs in found:
            raw = text_keys(tools, name)
            out.append({"name": name,
                        "arguments": {k: read_value(v, raw.get(k)) for k, v in pairs}})
        return calls_of(out)

    def read(self, body: str) -> Found:
        """The calls in the text between the markers, each value's text as written (empty:
        none in this format's own shape)."""
        return []
