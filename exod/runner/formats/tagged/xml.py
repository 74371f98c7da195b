"""The formats whose calls are XML-like tags: Qwen3-Coder's `<function=NAME>` with
`<parameter=KEY>`, GLM's `<arg_key>`/`<arg_value>` pairs (Laguna's, LongCat's) and MiniCPM5's
`<function name="NAME">` with `<param name="KEY">` (CDATA where the text needs it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from exod.runner.formats.base import Allowed, Literal, Transitions
from exod.runner.formats.grammar_parts import Param, quoted, repeat
from exod.runner.formats.tagged.base import Found, Tagged, rx_text, text_span
from exod.runner.formats.tagged.values import resolved

_NAME = re.compile(r"[\w.\-]+")  # a tool's name alone (a call without arguments)
_NL = '"\\n"?'  # a newline some templates of the format write and others do not
_QWEN_FN = re.compile(r"<function=([^\s<>]+)>(.*?)</function>", re.S)
_QWEN_PARAM = re.compile(r"<parameter=([^\s<>]+)>(.*?)</parameter>", re.S)


@dataclass(frozen=True)
class Qwen3Coder(Tagged):
    """`<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n...</function>
    \\n</tool_call>`, one block a call, after a newline (StepFun's template: none). Values are
    Jinja's `| string` (Python's `True`), objects and arrays `tojson`."""

    SHUT = "\n</parameter>"
    bad_key = r"[<>\s]"  # its parser ends a key at whitespace
    python_bools = True
    # Qwen3-Coder sometimes writes a call without its `<tool_call>` block (about one call in
    # five leaked as raw XML in ollama #17742): such a call is read too, its tags kept.
    kept = ("<function=", "</function>")

    def table(self, tools: bool) -> tuple[str, Transitions]:
        initial, table = super().table(tools)
        if tools:
            table = {**table, "normal": [*table["normal"], ("<function=", "tool_bare")],
                     "tool_bare": [("</function>", "normal")]}
        return initial, table

    def block(self, allowed: Allowed, lit: Literal, top: str) -> str:
        head, tail = lit(self.start + "\n"), lit("\n" + self.end)
        return f"{top}: {repeat('call', _NL, allowed.most)}\ncall: {head} call_body {tail}\n"

    def opening(self, name: str, lit: Literal) -> str:
        return lit(f"<function={name}>\n")

    def closing(self, lit: Literal) -> str:
        return lit("</function>")

    def key(self, p: Param, lit: Literal) -> str:
        return lit(f"<parameter={p.name}>\n")

    def after(self, lit: Literal) -> str:
        return lit("\n")

    def cuts(self) -> tuple[str, ...]:
        return ("</parameter>", "</function>", self.end)

    def read(self, body: str) -> Found:
        # The template writes a newline on either side of a value: one each is not the value's.
        return [(name, [(k, v.removeprefix("\n").removesuffix("\n"))
                        for k, v in _QWEN_PARAM.findall(inner)])
                for name, inner in _QWEN_FN.findall(body)]


@dataclass(frozen=True)
class Glm(Tagged):
    """`<tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>...</tool_call>`, with
    or without a newline between the tags (GLM 4.6 and Laguna XS with, GLM 4.7 and Laguna S
    without: the model chooses). LongCat's is the same with its tags' prefix
    (`<longcat_arg_key>`). Values: strings as they are, the rest `tojson`."""

    @property
    def prefix(self) -> str:
        return self.start[1:].removesuffix("tool_call>") if self.start.startswith("<") else ""

    def tag(self, name: str, closing: bool = False) -> str:
        return f"<{'/' if closing else ''}{self.prefix}{name}>"

    @property
    def shut(self) -> str:
        return self.tag("arg_value", closing=True)

    def block(self, allowed: Allowed, lit: Literal, top: str) -> str:
        return (f"{top}: {repeat('call', _NL, allowed.most)}\n"
                f"call: {lit(self.start)} call_body\n")

    def opening(self, name: str, lit: Literal) -> str:
        return quoted(name)

    def closing(self, lit: Literal) -> str:
        return f"{_NL} {lit(self.end)}"

    def key(self, p: Param, lit: Literal) -> str:
        return (f"{_NL} {lit(self.tag('arg_key'))} {quoted(p.name)} "
                f"{lit(self.tag('arg_key', closing=True))} {_NL} {lit(self.tag('arg_value'))}")

    def read(self, body: str) -> Found:
        head, sep, _ = body.partition(self.tag("arg_key"))
        name = head.strip()
        if not sep:  # a call without arguments; else another shape (JSON): mlx-lm's
            return [(name, [])] if _NAME.fullmatch(name) else []
        return [(name, [(k.strip(), v) for k, v in _glm_pairs(self.prefix).findall(body)])]


@lru_cache(maxsize=4)
def _glm_pairs(prefix: str) -> re.Pattern[str]:
    key, value = f"{prefix}arg_key", f"{prefix}arg_value"
    return re.compile(rf"<{key}>(.*?)</{key}>\s*<{value}>(.*?)</{value}>", re.S)


NEWLINE = "\n"
_CPM_FN = re.compile(r'(?:<function name=)?"([^"]*)">(.*?)(?:</function>|$)', re.S)
_CPM_PARAM = re.compile(r'<param name="([^"]*)">(.*?)</param>', re.S)
_CDATA = re.compile(r"\s*<!\[CDATA\[(.*)\]\]>\s*", re.S)
_NEEDS_CDATA = re.compile(r"[<&\n]|^\s|\s$")


@dataclass(frozen=True)
class MiniCpm5(Tagged):
    """MiniCPM5's: `<function name="NAME"><param name="KEY">VALUE</param></function>`, calls
    one a line, no block around them (the splitter hands the parser `"NAME">...`, its start
    marker `<function name=` cut off). A string with `<`, `&` or a newline is written in a CDATA
    block, as the template writes it, and so is one with whitespace at either end (which the
    parser would strip from plain text); the template prints other values with Jinja
    (`True`, `{'a': 1}`): booleans are written so, objects and arrays as JSON, which the
    parser reads first."""

    SHUT = "</param>"
    python_bools = True

    def block(self, allowed: Allowed, lit: Literal, top: str) -> str:
        return f"{top}: {repeat('call_body', lit(NEWLINE), allowed.most)}\n"

    def opening(self, name: str, lit: Literal) -> str:
        return lit(f'{self.start}"{name}">')

    def closing(self, lit: Literal) -> str:
        return lit(self.end)

    def key(self, p: Param, lit: Literal) -> str:
        return lit(f'<param name="{p.name}">')

    def plain(self, text: str) -> str:
        return f"<![CDATA[{text}]]>" if _NEEDS_CDATA.search(text) else text

    def text(self, rule: str, p: Param, close: str) -> list[str]:
        """Plain text (none of `<`, `&`, a newline, whitespace at its ends), or a CDATA block
        for text that needs one."""
        if Param(p.name, resolved(p.schema), p.required).enum is not None:
            return super().text(rule, p, close)
        (low, span), term = text_span(resolved(p.schema)), rule.upper()
        never = "|".join(rx_text(c) for c in self.cuts())
        plain = (f"{term}_PLAIN: /[^<&\\s]([^<&\\n]*[^<&\\s])?/ & /(?s:.{span})/\n")
        maybe = "" if low else "?"  # the empty value is plain
        needs = "(?s:.*[<&\\n].*|\\s.*|.*\\s)"
        if close.startswith("<["):
            return [f'{rule}: ({term}_PLAIN{maybe} | "<![CDATA[" {term}) {close}\n', plain,
                    f"{term}: /{needs}\\]\\]>/ & /(?s:.{span})\\]\\]>/"
                    f" & ~/(?s:.*)({never})(?s:.*)/\n"]
        end = "\\]\\]>" + rx_text(self.shut)
        return [f'{rule}: {term}_PLAIN{maybe} {close} | "<![CDATA[" {rule}_cdata\n', plain,
                f"{rule}_cdata[lazy]: {term}\n",
                f"{term}: /{needs}{end}/ & /(?s:.{span}){end}/ & ~/(?s:.*)({never})(?s:.*){end}/\n"]

    def read(self, body: str) -> Found:
        out = []
        for name, inner in _CPM_FN.findall(body.strip()):
            pairs = []
            for k, v in _CPM_PARAM.findall(inner):
                cdata = _CDATA.fullmatch(v)
                pairs.append((k, cdata.group(1) if cdata else v))
            out.append((name, pairs))
        return out
