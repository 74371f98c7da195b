"""Formats that write a call parameter by parameter between tags, strings as raw text and other
values as JSON: Qwen3-Coder's XML, GLM's `<arg_key>`/`<arg_value>` (and Laguna's, LongCat's),
MiniMax-M2's `<invoke>`, MiniCPM5's `<function name=...>`, Kimi K3's XTML, Muse Spark's.

A parameter's value is written as its template writes it: a string (a plain `string`, a string
enum, a string or null: pydantic's `Optional[str]`) as the text itself, anything else as compact
JSON (booleans as Python's `True`/`False` where the template prints them with Jinja's
`| string`). A string inside any other union (`anyOf` a string and a number) is JSON-quoted:
raw, no parser could tell it from a number.

Forced calls are read back exactly: mlx-lm's parsers (0.32) strip string values, read `null` as
None whatever the type, and read strings that look like JSON as JSON, so these formats read the
values themselves, by the tool's schema (`Tagged.read`); mlx-lm's parser still reads what they
do not recognise (GLM's JSON-shaped calls). Kimi K3 names each argument's type in the text, so
mlx-lm's parser reads it exactly as it is.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, ClassVar

from exod.core.request_rules import RequestError
from exod.runner.formats.base import (Allowed, Call, Literal, ToolFormat, Transitions,
                                      calls_of)
from exod.runner.formats.grammar_parts import (Param, choice, json_args, json_value,
                                               parameters, params, quoted, repeat, rx)
from exod.runner.serving import json_bounds

TEXT, BOOL, JSON = "text", "bool", "json"  # how a parameter's value is written
Found = list[tuple[str, list[tuple[str, str]]]]  # calls read: (name, [(key, value's text)])
_NAME = re.compile(r"[\w.\-]+")  # a tool's name alone (a call without arguments)


# ---- parameters --------------------------------------------------------------------------------
def _defs(schema: dict[str, Any]) -> dict[str, Any]:
    return {k: schema[k] for k in ("$defs", "definitions") if k in schema}


def _resolved(schema: Any) -> Any:
    """A property's schema with its local `$ref`s followed (the root's definitions kept
    beside it, as Param carries them)."""
    for _ in range(8):  # a chain of references, not a loop of them
        if not isinstance(schema, dict) or not isinstance(schema.get("$ref"), str):
            return schema
        target = json_bounds.pointer(schema, schema["$ref"])
        if not isinstance(target, dict):
            return schema
        schema = {**target, **_defs(schema)}
    return schema


def _is_text(schema: Any) -> bool:
    """A string and nothing else: written as the text itself."""
    if not isinstance(schema, dict) or any(k in schema for k in ("anyOf", "oneOf", "allOf",
                                                                  "$ref")):
        return False
    if schema.get("type") == "string":
        return True
    return "type" not in schema and Param("", schema, False).enum is not None


_ASIDE = frozenset({"title", "description", "default", "examples", "deprecated", "$defs",
                    "definitions", "$comment"})  # keys beside a union that change nothing


def _text(schema: Any) -> tuple[dict[str, Any], bool] | None:
    """The string a parameter is written as raw text by, and whether it may be null instead
    (`anyOf` a string and null, or `type: [string, null]`: its template writes None as
    `null`, or `None`, which reads back as None); None: not raw text."""
    schema = _resolved(schema)
    if _is_text(schema):
        return schema, False
    if not isinstance(schema, dict):
        return None
    kinds = schema.get("type")
    if isinstance(kinds, list) and sorted(kinds) == ["null", "string"] and not any(
            k in schema for k in ("anyOf", "oneOf", "allOf", "$ref", "enum", "const")):
        return {**schema, "type": "string"}, True
    for union in ("anyOf", "oneOf"):
        members = schema.get(union)
        if not isinstance(members, list) or len(members) != 2 or not _ASIDE.issuperset(
                set(schema) - {union}):
            continue
        both = [_resolved({**m, **_defs(schema)}) for m in members if isinstance(m, dict)]
        texts = [m for m in both if _is_text(m)]
        if len(texts) == 1 and any(m.get("type") == "null" and len(set(m) - _ASIDE) == 1
                                   for m in both):
            return texts[0], True
    return None


def written_as(p: Param, strict: bool, tool: str) -> tuple[str, Param]:
    """How parameter `p` of `tool` is written, and by what schema (a nullable string's string).
    A raw string cannot hold a `pattern` or a `format` the engine enforces: a strict tool with
    one is refused, a lenient one goes without it (as the engine's lenient JSON leaves out
    what it cannot enforce)."""
    text = _text(p.schema)
    if text is not None:
        schema = text[0]
        if strict and ("pattern" in schema or "format" in schema):
            raise RequestError(f"`tools`: {tool!r} is strict, and its parameter {p.name!r} has "
                               "a `pattern` or `format`, which this model writes as raw text "
                               "that the grammar cannot enforce", "tools")
        return TEXT, Param(p.name, schema, p.required)
    schema = _resolved(p.schema)
    return BOOL if isinstance(schema, dict) and schema.get("type") == "boolean" else JSON, p


def _span(schema: Any) -> tuple[int, str]:
    """A string's minLength, and a regex repetition for it and its maxLength."""
    s = schema if isinstance(schema, dict) else {}
    low, high = s.get("minLength"), s.get("maxLength")
    low = low if isinstance(low, int) and low > 0 else 0
    if isinstance(high, int) and high >= low:
        return low, f"{{{low},{high}}}"
    return low, f"{{{low},}}" if low else "*"


def _rx(text: str) -> str:
    return rx(text).replace("\n", "\\n")


def _text_keys(tools: Any, name: str) -> dict[str, bool]:
    """The keys of tool `name` whose values are raw text, each with whether it may be null
    (none for a tool not in `tools`)."""
    for tool in tools or ():
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and fn.get("name") == name:
            root = parameters(fn)
            props = root.get("properties")
            out = {}
            for k, s in props.items() if isinstance(props, dict) else ():
                text = _text({**s, **_defs(root)}) if isinstance(s, dict) else None
                if text is not None:
                    out[k] = text[1]
            return out
    return {}


def _value(text: str, raw: bool | None) -> Any:
    """A value read back: raw text as it is (`raw` True: or None, where it may be null); else
    JSON, or the Python literal a template's `| string` prints (`True`, `None`, `{'a': 1}`),
    or the text itself."""
    if raw is not None:
        return None if raw and text.strip() in ("null", "None") else text
    s = text.strip()
    try:
        return json.loads(s, parse_constant=_no_constant)
    except ValueError:
        pass
    try:
        v = ast.literal_eval(s)
        json.dumps(v)  # only what JSON can carry (no set, no bytes)
        return v
    except Exception:  # noqa: BLE001 -- literal_eval raises many kinds on what is not one
        return s


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is no JSON")  # NaN, Infinity: no client could read them back


# ---- the formats -------------------------------------------------------------------------------
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
        values = Param(p.name, _resolved(p.schema), p.required).enum
        if values is not None:
            return [f"{rule}: ({' | '.join(quoted(self.plain(v)) for v in values)}) {close}\n"]
        span, term = _span(_resolved(p.schema))[1], rule.upper()
        never = "|".join(_rx(c) for c in self.cuts())
        if close.startswith("<["):
            return [f"{rule}: {term} {close}\n",
                    f"{term}: /(?s:.{span})/ & ~/(?s:.*)({never})(?s:.*)/\n"]
        end = _rx(self.shut)  # no cut before the closer (which may hold one: `<|close|>`)
        return [f"{rule}[lazy]: {term}\n",
                f"{term}: /(?s:.{span}){end}/ & ~/(?s:.*)({never})(?s:.*){end}/\n"]

    # -- parsing --
    def parse(self, body: str, tools: Any) -> list[Call]:
        found = self.read(body)
        if not found:  # a shape of its own: mlx-lm's parser reads those
            return super().parse(body, tools)
        out = []
        for name, pairs in found:
            raw = _text_keys(tools, name)
            out.append({"name": name, "arguments": {k: _value(v, raw.get(k)) for k, v in pairs}})
        return calls_of(out)

    def read(self, body: str) -> Found:
        """The calls in the text between the markers, each value's text as written (empty:
        none in this format's own shape)."""
        return []


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


@dataclass(frozen=True)
class Invoke(Tagged):
    """MiniMax-M2's: `<minimax:tool_call>\\n`, each call `<invoke name="NAME">\\n`, its
    parameters `<parameter name="KEY">VALUE</parameter>\\n`, `</invoke>\\n`, then
    `</minimax:tool_call>`: the calls of a turn in one block. Values: strings as they are, the
    rest `tojson`."""

    invoke: ClassVar[str] = "invoke"
    param: ClassVar[str] = "parameter"
    SHUT = "</parameter>"

    def block(self, allowed: Allowed, lit: Literal, top: str) -> str:
        head = lit(self.start + "\n")
        return f"{top}: {head} {repeat('call_body', '', allowed.most)} {lit(self.end)}\n"

    def opening(self, name: str, lit: Literal) -> str:
        return lit(f'<{self.invoke} name="{name}">\n')

    def closing(self, lit: Literal) -> str:
        return lit(f"</{self.invoke}>\n")

    def key(self, p: Param, lit: Literal) -> str:
        return lit(f'<{self.param} name="{p.name}">')

    def after(self, lit: Literal) -> str:
        return lit("\n")

    def cuts(self) -> tuple[str, ...]:
        return (self.shut, f"</{self.invoke}>", self.end)

    def read(self, body: str) -> Found:
        calls, values = _invokes(self.invoke, self.param)
        return [(name, values.findall(inner)) for name, inner in calls.findall(body)]


@lru_cache(maxsize=4)
def _invokes(invoke: str, param: str) -> tuple[re.Pattern[str], re.Pattern[str]]:
    return (re.compile(rf'<{invoke} name="([^"]*)">(.*?)</{invoke}>', re.S),
            re.compile(rf'<{param} name="([^"]*)">(.*?)</{param}>', re.S))


# Muse Spark's turn, as mlx-lm's chat template module gives it (mlx_lm.chat_templates.
# muse_spark.RESPONSE_FORMAT), with its calls: each message has a header, `to=` its recipient.
MUSE_FORMAT: dict[str, Any] = {
    "initial_state": "header",
    "transitions": {
        "header": [("to=self<|message|>", "reasoning"), ("to=user<|message|>", "normal"),
                   ("to=commentary<|message|>", "normal"), ("<atem:function_calls>", "tool")],
        "reasoning": [("<|eom|>", "header")],
        "normal": [("<|eom|>", "header"), ("<|eot|>", "normal")],
        "tool": [("</atem:function_calls>", "normal")],
    },
}


@dataclass(frozen=True)
class Muse(Invoke):
    """Muse Spark's (muse-glimmer's template): each call a message of its own, its header
    addressed to the tool, ` to=NAME<|message|>` (the prompt ends with `<|start|>assistant`),
    then `<atem:function_calls>\\n<atem:invoke name="NAME">\\n`, its parameters
    `<atem:parameter name="KEY">VALUE</atem:parameter>\\n`, and `</atem:invoke>\\n
    </atem:function_calls>`; the next call after `<|eom|><|start|>assistant`."""

    invoke = "atem:invoke"
    param = "atem:parameter"
    SHUT = "</atem:parameter>"

    def table(self, tools: bool) -> tuple[str, Transitions]:
        # Calls sit in the turn's structure: without tools they are still cut out (and dropped).
        return MUSE_FORMAT["initial_state"], MUSE_FORMAT["transitions"]

    def block(self, allowed: Allowed, lit: Literal, top: str) -> str:
        return f"{top}: {repeat('call_body', lit('<|eom|><|start|>assistant'), allowed.most)}\n"

    def opening(self, name: str, lit: Literal) -> str:
        return lit(f' to={name}<|message|>{self.start}\n<{self.invoke} name="{name}">\n')

    def closing(self, lit: Literal) -> str:
        return lit(f"</{self.invoke}>\n{self.end}")

    def thinking(self, lit: Literal) -> tuple[str, str] | None:
        """A message to itself, as Lark: its start and its end (up to the next header)."""
        return lit(" to=self<|message|>"), lit("<|eom|><|start|>assistant")

    def answer(self, lit: Literal) -> str | None:
        """What comes before a constrained answer: the header of a message to the user."""
        return lit(" to=user<|message|>")


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
        if Param(p.name, _resolved(p.schema), p.required).enum is not None:
            return super().text(rule, p, close)
        (low, span), term = _span(_resolved(p.schema)), rule.upper()
        never = "|".join(_rx(c) for c in self.cuts())
        plain = (f"{term}_PLAIN: /[^<&\\s]([^<&\\n]*[^<&\\s])?/ & /(?s:.{span})/\n")
        maybe = "" if low else "?"  # the empty value is plain
        needs = "(?s:.*[<&\\n].*|\\s.*|.*\\s)"
        if close.startswith("<["):
            return [f'{rule}: ({term}_PLAIN{maybe} | "<![CDATA[" {term}) {close}\n', plain,
                    f"{term}: /{needs}\\]\\]>/ & /(?s:.{span})\\]\\]>/"
                    f" & ~/(?s:.*)({never})(?s:.*)/\n"]
        end = "\\]\\]>" + _rx(self.shut)
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


# Markers of Kimi K3's turn that are no text of the answer (as mlx-lm strips them).
XTML_STRUCTURE = ("<|open|>response<|sep|>", "<|close|>response<|sep|>",
                  "<|close|>message<|sep|>")
_JSON_BLOCK = '<|open|>json type="object"<|sep|>'
_XTML_TYPES = {"integer": "number", "number": "number", "boolean": "boolean",
               "object": "object", "array": "array", "null": "null"}


@dataclass(frozen=True)
class KimiK3(Tagged):
    """Kimi K3's XTML: after the answer's `<|close|>response<|sep|>`, `<|open|>tools<|sep|>`,
    each call `<|open|>call tool="NAME" index="N"<|sep|>` (N from 1 in the message), its
    arguments `<|open|>argument key="KEY" type="TYPE"<|sep|>VALUE<|close|>argument<|sep|>`
    (strings as they are, the rest `tojson`), `<|close|>call<|sep|>`, then
    `<|close|>tools<|sep|>`. A tool whose parameters take no single type each (a union, keys
    beyond `properties`) is called with a JSON block, `<|open|>json type="object"<|sep|>ARGS
    <|close|>json<|sep|>`, which the template writes too. mlx-lm's parser reads the types."""

    SHUT = "<|close|>argument<|sep|>"
    bad_key = ""  # escaped as the template escapes an attribute

    def table(self, tools: bool) -> tuple[str, Transitions]:
        structure = [(m, "normal") for m in XTML_STRUCTURE]
        if not tools:
            return "normal", {"normal": structure}
        return "normal", {"normal": [(self.start, "tool"), *structure],
                          "tool": [(self.end, "normal")]}

    def cuts(self) -> tuple[str, ...]:
        return ("<|close|>", "<|open|>")

    def key(self, p: Param, lit: Literal) -> str:
        schema = _resolved(p.schema)
        named = "string" if _is_text(schema) else _XTML_TYPES[schema["type"]]
        return lit(f'<|open|>argument key="{_attr(p.name)}" type="{named}"<|sep|>')

    def grammar(self, allowed: Allowed, lit: Literal, top: str) -> str:
        """The answer closed (after reasoning, its response opened first), then the calls,
        each with its own index."""
        rules = [f"{top}: ({lit(XTML_STRUCTURE[0])})? {lit(XTML_STRUCTURE[1])} "
                 f"{lit(self.start)} call_0 {lit(self.end)}\n"]
        for k in range(allowed.most):
            more = f" call_{k + 1}?" if k + 1 < allowed.most else ""
            heads = [lit(f'<|open|>call tool="{_attr(f["name"])}" index="{k + 1}"<|sep|>')
                     for f in allowed.functions]
            rules.append(f"call_{k}: ({' | '.join(f'{h} args_{i}' for i, h in enumerate(heads))})"
                         f" {lit('<|close|>call<|sep|>')}{more}\n")
        for i, fn in enumerate(allowed.functions):
            if self.typed(fn):
                more_rules, body = self.arguments(i, fn, allowed, lit)
                rules += [f'args_{i}: {body or quoted("")}\n', *more_rules]
            else:
                rules += [f"args_{i}: {lit(_JSON_BLOCK)} json_{i} {lit('<|close|>json<|sep|>')}\n",
                          f"json_{i}: {json_args(fn, allowed)}\n"]
        return "".join(rules)

    def typed(self, fn: dict[str, Any]) -> bool:
        """Whether every parameter has a type the template can name."""
        try:
            props = list(params(fn))
        except RequestError:  # keys beyond its properties: the JSON block takes them
            return False
        for p in props:
            schema = _resolved(p.schema)
            if not (_is_text(schema) or (isinstance(schema, dict)
                                         and schema.get("type") in _XTML_TYPES)):
                return False
        return True


def _attr(text: str) -> str:
    """An attribute's value as Kimi K3's template escapes it."""
    return text.replace("&", "&amp;").replace('"', "&quot;")


# mlx-lm's parser module -> the class that forces calls in that format.
KINDS: dict[str, type[ToolFormat]] = {"qwen3_coder": Qwen3Coder, "glm47": Glm, "laguna": Glm,
                                      "longcat": Glm, "minimax_m2": Invoke,
                                      "minicpm5": MiniCpm5, "kimi_k3": KimiK3,
                                      "muse_spark": Muse}
