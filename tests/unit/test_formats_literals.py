"""Formats whose arguments are written in a literal syntax of their own
(exod.runner.formats.literals): Gemma 4's, FunctionGemma's and the pythonic one (LFM2). A forced
grammar accepts a call exactly as the model's real chat template renders it (llama.cpp's copies,
tests.models.templates), refuses what the template would never write, and whatever it lets a
model write, mlx-lm's own parser reads back to arguments that validate against the tool's
parameters (random walks through the grammar, one byte a token).

mlx-lm's parsers are loaded from their files: they need only `regex`, and importing the mlx_lm
package would import mlx, which the unit tier never does.
"""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path
from typing import Any

import jsonschema
import llguidance
import pytest
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from exod.core.request_rules import RequestError
from exod.runner import formats
from exod.runner.formats.base import Allowed, ParsedCall, ToolFormat
from exod.runner.formats.literals import FunctionGemma, Gemma4, Pythonic
from exod.runner.serving.strict_args import EOS, byte_tokenizer
from tests.unit.accepts import accepts


# ---- mlx-lm's parsers and the real templates ---------------------------------------------------
def mlx_parser(module: str) -> Any:
    """mlx-lm's `parse_tool_call` of `mlx_lm/tool_parsers/<module>.py`, the package unimported."""
    spec = importlib.util.find_spec("mlx_lm")  # finds the package without running it
    assert spec is not None and spec.submodule_search_locations
    path = Path(spec.submodule_search_locations[0]) / "tool_parsers" / f"{module}.py"
    loaded = importlib.util.spec_from_file_location(f"_mlx_lm_parser_{module}", path)
    assert loaded is not None and loaded.loader is not None
    mod = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(mod)
    return mod.parse_tool_call


GEMMA4 = Gemma4("gemma4", "<|tool_call>", "<tool_call|>", mlx_parser("gemma4"))
FUNCTION_GEMMA = FunctionGemma("function_gemma", "<start_function_call>", "<end_function_call>",
                               mlx_parser("function_gemma"))
PYTHONIC = Pythonic("pythonic", "<|tool_call_start|>", "<|tool_call_end|>",
                    mlx_parser("pythonic"))


@pytest.fixture(scope="module")
def templates(chat_templates: Path) -> Path:
    """The folder the real templates are read from (one place to point elsewhere)."""
    return chat_templates


class _Generation(Extension):
    """`{% generation %}`, which transformers' renderer adds (it marks the assistant's tokens):
    its body as it is."""

    tags = {"generation"}

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body).set_lineno(lineno)


def _raise(message: str) -> None:
    raise ValueError(message)


def render(folder: Path, name: str, calls: list[tuple[str, dict[str, Any]]]) -> str:
    """An assistant turn making `calls`, as template `name` renders it, with the environment
    transformers renders chat templates in (its `tojson`: not sorted, not HTML-escaped)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols, _Generation])
    env.filters["tojson"] = lambda x, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)
    env.globals["raise_exception"] = _raise
    template = env.from_string((folder / name).read_text(encoding="utf-8"))
    tool_calls = [{"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}}
                  for i, (n, a) in enumerate(calls)]
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": "", "tool_calls": tool_calls}]
    return template.render(messages=messages, tools=TOOLS, bos_token="<bos>",
                           add_generation_prompt=False)


def between(text: str, start: str, end: str) -> str:
    """From the first `start` to the last `end`, both kept."""
    return text[text.index(start):text.rindex(end) + len(end)]


# ---- tools -------------------------------------------------------------------------------------
ITEM = {"type": "object", "properties": {"id": {"type": "integer"},
                                         "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["id"]}
PARAMS = {
    "$defs": {"Item": ITEM, "Color": {"enum": ["red", "green", "dark blue"]}},
    "type": "object",
    "properties": {
        "text": {"type": "string"},
        "count": {"type": "integer"},
        "ratio": {"type": "number"},
        "on": {"type": "boolean"},
        "maybe": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
        "item": {"$ref": "#/$defs/Item"},
        "color": {"$ref": "#/$defs/Color"},
        "Zeta": {"type": "array", "items": {"type": "number"}},
        "note": {"type": "string"},
    },
    "required": ["text", "count", "on", "item"],
}
GET = {"name": "get", "parameters": PARAMS}
ADD = {"name": "add"}
TOOLS = [{"type": "function", "function": f} for f in (GET, ADD)]
# In the schema's order: the pythonic template writes them in the order they come.
FULL = {"text": 'say "hi" {x}, y: z', "count": -42, "ratio": 0.125, "on": True, "maybe": None,
        "item": {"id": 7, "tags": ["a", "b c"]}, "color": "dark blue", "Zeta": [1.5, -2]}
SHORT = {"text": "", "count": 0, "on": False, "item": {"id": 1}}  # the optional ones left out
MULTILINE = {**FULL, "text": 'line "one"\n{line: two}\n', "maybe": "x"}


def grammar(fmt: ToolFormat, *functions: dict[str, Any], most: int = 1,
            strict: tuple[str, ...] = ()) -> str:
    return fmt.grammar(Allowed(functions, most, frozenset(strict)), json.dumps, "start")


def args_of(calls: list[ParsedCall]) -> list[tuple[str, Any]]:
    return [(c.name, json.loads(c.arguments)) for c in calls]


def bodies(text: str, fmt: ToolFormat) -> list[str]:
    """The text of each call between the format's markers, as the splitter hands it over."""
    return [part.split(fmt.end, 1)[0] for part in text.split(fmt.start)[1:]]


# ---- Gemma 4 -----------------------------------------------------------------------------------
@pytest.mark.parametrize("args", [FULL, SHORT, MULTILINE], ids=["full", "short", "multiline"])
def test_gemma4_accepts_its_templates_calls_and_reads_them_back(templates: Path,
                                                                 args: dict[str, Any]) -> None:
    text = between(render(templates, "google-gemma-4-31B-it.jinja", [("get", args), ("add", {})]),
                   "<|tool_call>", "<tool_call|>")
    assert accepts(grammar(GEMMA4, GET, ADD, most=2), text), text
    assert [c for b in bodies(text, GEMMA4) for c in args_of(GEMMA4.parse(b, None))] == [
        ("get", args), ("add", {})]


def test_gemma4_writes_keys_sorted_strings_raw_and_null_as_its_template() -> None:
    call = ('<|tool_call>call:get{color:<|"|>red<|"|>,count:-42,item:{id:7,tags:[<|"|>a<|"|>]},'
            'maybe:None,on:true,text:<|"|>a "b" {c}<|"|>,Zeta:[1.5,-2]}<tool_call|>')
    one = grammar(GEMMA4, GET, ADD)
    assert accepts(one, call)
    for bad in (call.replace("call:get", "call:put"),  # a wrong name
                call.replace("count:-42,", ""),  # a required key missing
                call.replace("color:", "colour:"),  # a key the schema does not name
                call.replace("on:true,", "zz:1,on:true,"),
                call.replace("color:<|\"|>red<|\"|>,count:-42", "count:-42,color:<|\"|>red<|\"|>"),
                call.replace("{id:7,tags:", "{tags:").replace("]}", "],id:7}"),  # nested, unsorted
                call.replace("-42", "1" * 18),  # past 16 integral digits
                call.replace("maybe:None", "maybe:null"),  # not as the template writes null
                call.replace('<|"|>red<|"|>', '"red"'),  # a JSON string
                call + call):  # two calls, one allowed
        assert not accepts(one, bad), bad
    assert accepts(grammar(GEMMA4, GET, most=2), call + call)
    assert not accepts(grammar(GEMMA4, GET, most=2), call * 3)


# ---- FunctionGemma -----------------------------------------------------------------------------
FLAT = {"type": "object", "properties": {
    "text": {"type": "string"}, "count": {"type": "integer"}, "ratio": {"type": "number"},
    "on": {"type": "boolean"}, "maybe": {"type": ["string", "null"]},
    "tags": {"type": "array", "items": {"type": "string"}}, "color": {"enum": ["red", "green"]}},
    "required": ["text", "count"]}
FLAT_GET = {"name": "get", "parameters": FLAT}


def test_function_gemma_forced_calls_are_read_back_by_its_parser() -> None:
    call = ('<start_function_call>call:get{color:<escape>red<escape>,count:-42,maybe:null,'
            'on:false,ratio:0.5,tags:["a b"],text:<escape>a, b: "c"\n[d]<escape>}'
            "<end_function_call>")
    g = grammar(FUNCTION_GEMMA, FLAT_GET, ADD, most=2)
    assert accepts(g, call) and accepts(g, call + call)
    assert args_of(FUNCTION_GEMMA.parse(bodies(call, FUNCTION_GEMMA)[0], None)) == [
        ("get", {"color": "red", "count": -42, "maybe": None, "on": False, "ratio": 0.5,
                 "tags": ["a b"], "text": 'a, b: "c"\n[d]'})]
    for bad in (call.replace("[d]", "{d}"),  # its parser cuts the call at the first `}`
                call.replace('["a b"]', '["a","b"]'),  # ... and a value at the first `,`
                call.replace("count:-42,", ""), call.replace("call:get", "call:put"),
                call.replace("-42", "1" * 18), call * 3):
        assert not accepts(g, bad), bad


def test_function_gemma_cannot_force_an_object_inside_a_call() -> None:
    nested = {"name": "get", "parameters": {"type": "object", "properties": {"item": ITEM},
                                            "required": ["item"]}}
    with pytest.raises(RequestError) as e:
        grammar(FUNCTION_GEMMA, nested, strict=("get",))
    assert e.value.param == "tools" and "'get'" in str(e.value)
    # Lenient: the free value, which in this format is a scalar or an array of one.
    g = grammar(FUNCTION_GEMMA, nested)
    assert accepts(g, "<start_function_call>call:get{item:1}<end_function_call>")


# ---- pythonic (LFM2) ---------------------------------------------------------------------------
@pytest.mark.parametrize("args", [FULL, SHORT], ids=["full", "short"])
def test_pythonic_accepts_its_templates_calls_and_reads_them_back(templates: Path,
                                                                  args: dict[str, Any]) -> None:
    """LFM2.5-8B-A1B's template writes strings in single quotes as they are (one holding a
    quote or a newline would not be Python: the test's have none), dicts as JSON, the rest as
    Python prints it."""
    text = between(render(templates, "LFM2.5-8B-A1B.jinja", [("get", args), ("add", {})]),
                   "<|tool_call_start|>", "<|tool_call_end|>")
    assert "True" in text or "False" in text
    assert accepts(grammar(PYTHONIC, GET, ADD, most=2), text), text
    assert args_of(PYTHONIC.parse(bodies(text, PYTHONIC)[0], None)) == [("get", args),
                                                                        ("add", {})]


def test_pythonic_strings_are_python_literals_with_escapes(templates: Path) -> None:
    """LFM2.5-Instruct's template leaves the calls in the content, as the model writes them
    (its model card: double-quoted strings); a string with quotes or a newline is escaped."""
    assert "tool_call" not in (templates / "LFM2.5-Instruct.jinja").read_text()
    g = grammar(PYTHONIC, GET, ADD, most=2)
    item = {"id": 1, "tags": ["x"]}
    for text in (f"[get(text={json.dumps(MULTILINE['text'])}, count=1, on=true, "
                 f"item={json.dumps(item)})]",
                 f"[get(text={MULTILINE['text']!r}, count=1, on=False, item={item!r})]"):
        call = f"<|tool_call_start|>{text}<|tool_call_end|>"
        assert accepts(g, call), call
        got = args_of(PYTHONIC.parse(bodies(call, PYTHONIC)[0], None))[0][1]
        assert got["text"] == MULTILINE["text"] and got["item"] == item
    call = '<|tool_call_start|>[get(text="a", count=1, on=True, item={"id": 1})]<|tool_call_end|>'
    assert accepts(g, call)
    for bad in (call.replace('"a"', '"a\nb"'),  # a raw newline: no Python string
                call.replace('"a"', '"\\/"'),  # an escape Python does not read as JSON does
                call.replace("get(", "put("), call.replace("count=1, ", ""),
                call.replace("count=1", "count=1, zz=1"), call.replace("count=1", 'count="1"'),
                call.replace("count=1", "count=" + "1" * 18),
                call.replace("count=1, ", "count=1,"),  # `, ` between arguments, as written
                call.replace("[get", "[add(), add(), get")):  # three calls, two allowed
        assert not accepts(g, bad), bad


# ---- the converter, in each syntax -------------------------------------------------------------
def tool(params: dict[str, Any], name: str = "f") -> dict[str, Any]:
    return {"name": name, "parameters": params}


def obj(props: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(required)}


def g4(args: str) -> str:
    return f"<|tool_call>call:f{{{args}}}<tool_call|>"


def test_enums_and_consts_of_any_json_values() -> None:
    params = obj({"c": {"const": {"b": 1, "a": [True, None, "x"]}},
                  "e": {"enum": [1.5, "two", None, [1], {"k": False}]}}, ("c", "e"))
    g = grammar(GEMMA4, tool(params))
    c = 'c:{a:[true,None,<|"|>x<|"|>],b:1}'
    for e in ("1.5", '<|"|>two<|"|>', "None", "[1]", "{k:false}"):
        assert accepts(g, g4(f"{c},e:{e}")), e
    assert not accepts(g, g4(f"{c},e:2")) and not accepts(g, g4('c:{b:1},e:None'))
    p = grammar(PYTHONIC, tool(params))
    assert accepts(p, "<|tool_call_start|>[f(c={\"b\": 1, \"a\": [true, None, 'x']}, "
                      "e={'k': False})]<|tool_call_end|>")


def test_alternatives_type_lists_and_merged_objects() -> None:
    params = {"$defs": {"A": obj({"x": {"type": "integer"}}, ("x",))}, **obj({
        "u": {"oneOf": [{"type": "integer"}, {"type": "array", "items": {"type": "boolean"}}]},
        "t": {"type": ["boolean", "null"]},
        "m": {"allOf": [{"$ref": "#/$defs/A"}, obj({"y": {"type": "string"}}, ("y",))]}},
        ("u", "t", "m"))}
    g = grammar(GEMMA4, tool(params), strict=("f",))
    assert accepts(g, g4('m:{x:1,y:<|"|><|"|>},t:None,u:[true,false]'))
    assert accepts(g, g4('m:{x:1,y:<|"|>a<|"|>},t:true,u:3'))
    assert not accepts(g, g4('m:{x:1},t:true,u:3'))  # y is required by the second member
    assert not accepts(g, g4('m:{x:1,y:<|"|>a<|"|>,z:1},t:true,u:3'))  # merged: closed
    tangled = tool(obj({"m": {"allOf": [{"type": "string"}, {"maxLength": 3}]}}, ("m",)))
    with pytest.raises(RequestError):
        grammar(GEMMA4, tangled, strict=("f",))
    assert accepts(grammar(GEMMA4, tangled), g4("m:[1]"))  # lenient: the free value


def test_a_recursive_ref_is_followed_sixteen_levels_then_free() -> None:
    node = {"type": "object", "properties": {"kids": {"type": "array",
                                                      "items": {"$ref": "#/$defs/N"}}}}
    g = grammar(GEMMA4, tool({"$defs": {"N": node}, **obj({"n": {"$ref": "#/$defs/N"}}, ("n",))}))
    assert accepts(g, g4("n:{kids:[{},{kids:[{kids:[]}]}]}"))
    assert not accepts(g, g4("n:{kids:[{kid:[]}]}"))
    deep = "n:" + "{kids:[" * 16 + "{x:1}" + "]}" * 16
    assert accepts(g, g4(deep))  # past 16 levels, any value


def test_arrays_bounds_and_tuples() -> None:
    params = obj({"a": {"type": "array", "items": {"type": "integer"}, "minItems": 1,
                        "maxItems": 2},
                  "t": {"prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False,
                        "minItems": 1}}, ("a", "t"))
    g = grammar(GEMMA4, tool(params))
    assert accepts(g, g4('a:[1],t:[<|"|>s<|"|>]')) and accepts(g, g4('a:[1,2],t:[<|"|>s<|"|>,3]'))
    for bad in ('a:[],t:[<|"|>s<|"|>]', 'a:[1,2,3],t:[<|"|>s<|"|>]', "a:[1],t:[]",
                'a:[1],t:[<|"|>s<|"|>,3,4]', "a:[1],t:[3]"):
        assert not accepts(g, g4(bad)), bad


def test_keys_beyond_properties_only_where_allowed_and_bounded() -> None:
    params = {"type": "object", "properties": {"a": {"type": "integer"}},
              "additionalProperties": {"type": "boolean"}}
    g = grammar(GEMMA4, tool(params))
    assert accepts(g, g4("a:1,b:true,c_2:false")) and accepts(g, g4("b:true"))
    for bad in ("a:1,b:1", "a:1,a:2", "a:1," + "k" * 257 + ":true", "a:1,b-c:true"):
        assert not accepts(g, g4(bad)), bad
    closed = grammar(GEMMA4, tool(obj({"a": {"type": "integer"}})))
    assert accepts(closed, g4("")) and not accepts(closed, g4("a:1,b:true"))


def test_strings_and_numbers_keep_their_bounds() -> None:
    params = obj({"s": {"type": "string", "minLength": 2, "maxLength": 3},
                  "i": {"type": "integer", "minimum": 1, "maximum": 5},
                  "n": {"type": "number"}}, ("s", "i", "n"))
    g = grammar(PYTHONIC, tool(params))

    def call(s: str, i: str, n: str) -> str:
        return f"<|tool_call_start|>[f(s={s}, i={i}, n={n})]<|tool_call_end|>"
    assert accepts(g, call('"ab"', "5", "-0.5")) and accepts(g, call("'a\\n\"'", "1", "3"))
    for bad in (call('"a"', "1", "1"), call('"abcd"', "1", "1"), call('"ab"', "6", "1"),
                call('"ab"', "0", "1"), call('"ab"', "1", "1.12345678901"),
                call('"ab"', "1", "1e5")):
        assert not accepts(g, bad), bad


def test_what_cannot_be_forced_is_an_error_when_strict_and_free_when_lenient() -> None:
    for keyword in ({"pattern": "^a+$"}, {"format": "email"}):
        params = obj({"s": {"type": "string", **keyword}}, ("s",))
        for fmt in (GEMMA4, FUNCTION_GEMMA, PYTHONIC):
            with pytest.raises(RequestError) as e:
                grammar(fmt, tool(params), strict=("f",))
            assert e.value.param == "tools"
        assert accepts(grammar(GEMMA4, tool(params)), g4('s:<|"|>not a<|"|>'))
        with pytest.raises(RequestError):  # not left out as an alternative: asked for
            grammar(GEMMA4, tool(obj({"s": {"anyOf": [{"type": "null"}, params["properties"][
                "s"]]}})), strict=("f",))
    # What the syntax cannot write, in an alternative, is left out: the rest is written.
    maybe_obj = tool(obj({"o": {"anyOf": [ITEM, {"type": "null"}]}}, ("o",)))
    one = grammar(FUNCTION_GEMMA, maybe_obj, strict=("f",))
    assert accepts(one, "<start_function_call>call:f{o:null}<end_function_call>")
    # A key the format's parser cannot read: required, an error; optional, never written.
    for fmt, key in ((GEMMA4, "user-id"), (PYTHONIC, "from"), (FUNCTION_GEMMA, "a:b")):
        with pytest.raises(RequestError):
            grammar(fmt, tool(obj({key: {"type": "integer"}}, (key,))), strict=("f",))
        grammar(fmt, tool(obj({key: {"type": "integer"}})), strict=("f",))
    # A name it cannot read, strict or not.
    for fmt, name in ((GEMMA4, "get.it"), (FUNCTION_GEMMA, "get-it"), (PYTHONIC, "get-it")):
        with pytest.raises(RequestError):
            grammar(fmt, tool(obj({}), name))


def test_a_free_value_is_sixteen_containers_deep_at_most() -> None:
    g = grammar(GEMMA4, tool(obj({"v": {}}, ("v",))))
    assert accepts(g, g4('v:{k:[1.5,<|"|>s<|"|>,None,{}]}'))
    assert accepts(g, g4("v:" + "[" * 16 + "1" + "]" * 16))
    assert not accepts(g, g4("v:" + "[" * 17 + "1" + "]" * 17))


def test_a_special_token_delimiter_holds_any_text_up_to_it() -> None:
    """In Gemma 4's vocabulary `<|"|>` is one special token, which text never spells: a
    string is any text up to it (the byte tokenizer's one special token, its end, stands in)."""
    def lit(text: str) -> str:
        return f"<[{EOS}]>" if text == '<|"|>' else json.dumps(text)
    params = obj({"s": {"type": "string", "maxLength": 4}, "e": {"enum": ["a b"]}}, ("s", "e"))
    g = GEMMA4.grammar(Allowed((tool(params),), 1), lit, "start")
    assert f"<[{EOS}]> G4_STR_0_4 <[{EOS}]>" in g

    def tokens(s: bytes) -> list[int]:
        return [*b"<|tool_call>call:f{e:", EOS, *b"a b", EOS, *b",s:", EOS, *s, EOS,
                *b"}<tool_call|>"]
    for s, ok in ((b'<|"|', True), (b"}", True), (b"", True), (b"abcde", False)):
        matcher = llguidance.LLMatcher(byte_tokenizer(), g, log_level=0)
        assert (matcher.consume_tokens(tokens(s)) and matcher.is_accepting()) is ok, s


def test_the_formats_are_registered_by_mlx_lms_parser_module() -> None:
    assert formats.KINDS["gemma4"] is Gemma4 and formats.KINDS["pythonic"] is Pythonic
    assert formats.KINDS["function_gemma"] is FunctionGemma
    assert all(formats.KINDS[k].forceable for k in ("gemma4", "function_gemma", "pythonic"))


# ---- whatever a grammar lets a model write, the parser reads back ------------------------------
# What ends a string or a part (a delimiter of several bytes is taken whole), tried now and then
# in free text so that walks end; and the bytes that open or close a part.
_CLOSERS = [t.encode() for t in ('<|"|>', "<escape>", '"', "'", "]", "}", ")", ",", ", ")]
_EXITS = b'"\'<>{}[](),:= 0123456789-.'


def walk(g: str, rng: random.Random, limit: int = 1500) -> str | None:
    """A random text the grammar accepts, one byte at a time (None: it ran past `limit`):
    mostly ASCII letters in free text, now and then a closer, rarely any byte at all."""
    matcher = llguidance.LLMatcher(byte_tokenizer(), g, log_level=0)
    out = bytearray()
    while len(out) < limit:
        bits = int.from_bytes(matcher.compute_bitmask(), "little")
        allowed = [t for t in range(EOS + 1) if bits >> t & 1]
        if EOS in allowed and (len(allowed) == 1 or rng.random() < 0.5):
            return out.decode("utf-8")
        choices = [t for t in allowed if t != EOS]
        step = [rng.choice(choices)]
        if len(choices) > 40:  # free text
            r = rng.random()
            closers = [list(c) for c in _CLOSERS
                       if matcher.validate_tokens(list(c)) == len(c)] if r < 0.2 else []
            pool = ([t for t in choices if t in _EXITS] if r < 0.3 else
                    [t for t in choices if 0x61 <= t <= 0x7a] if r < 0.97 else choices)
            step = rng.choice(closers) if closers else [rng.choice(pool or choices)]
        assert matcher.consume_tokens(step), matcher.get_error()
        out += bytes(step)
    return None


@pytest.mark.parametrize(("fmt", "params"), [(GEMMA4, PARAMS), (FUNCTION_GEMMA, FLAT),
                                             (PYTHONIC, PARAMS)],
                         ids=["gemma4", "function_gemma", "pythonic"])
@pytest.mark.parametrize("strict", [True, False], ids=["strict", "lenient"])
def test_random_forced_calls_parse_back_and_validate(fmt: ToolFormat, params: dict[str, Any],
                                                     strict: bool) -> None:
    free = {"name": "free", "parameters": {"type": "object", "additionalProperties": True}}
    fns = (tool(params, "get"), ADD) if strict else (tool(params, "get"), ADD, free)
    g = grammar(fmt, *fns, most=3, strict=("get", "add") if strict else ())
    rng = random.Random(f"{fmt.kind}-{strict}")
    done = 0
    for _ in range(16):
        text = walk(g, rng)
        if text is None:
            continue
        calls = [c for b in bodies(text, fmt) for c in fmt.parse(b, None)]
        assert 1 <= len(calls) <= 3, text
        for name, args in args_of(calls):
            schema = next(f.get("parameters", {"type": "object"}) for f in fns
                          if f["name"] == name)
            jsonschema.validate(args, schema)
        done += 1
    assert done >= 12
