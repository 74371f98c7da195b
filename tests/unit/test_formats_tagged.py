"""Formats that write a call parameter by parameter between tags (exod.runner.formats.tagged):
the forced grammar accepts a call exactly as the model's published chat template renders it (JSON
values compact: the grammar writes no whitespace in them), and refuses what is not one of the
calls allowed; the format reads the call back to the same arguments, and so does mlx-lm's own
parser wherever it reads its format exactly.

Grammars are checked by the engine one byte a token (tests.unit.accepts), markers as text.
The templates are llama.cpp's copies (tests.models.templates), rendered as transformers renders
them. mlx-lm's parsers are loaded from their files: the unit tier never imports mlx, which
mlx_lm's package imports.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import llguidance
import pytest

from exod.core.request_rules import RequestError
from exod.runner import formats
from exod.runner.formats import Splitter, Thought
from exod.runner.formats.base import Allowed, ParsedCall
from exod.runner.formats.tagged import (Glm, Invoke, KimiK3, MiniCpm5, Muse, Qwen3Coder,
                                        Tagged)
from tests.models.templates import read_template
from tests.unit.accepts import accepts
from tests.unit.test_tool_calls import run

@pytest.fixture(scope="module")
def templates(chat_templates: Path) -> Path:
    """The folder the real templates are read from (one place to point elsewhere)."""
    return chat_templates


def render(folder: Path, name: str, calls: list[tuple[str, Any]],
           tools: list[dict[str, Any]]) -> str:
    """A user's turn and an assistant's calls, as the template renders them for the model."""
    from transformers.utils.chat_template_utils import render_jinja_template
    made = [{"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}}
            for i, (n, a) in enumerate(calls)]
    messages = [{"role": "user", "content": "USERTURN"},
                {"role": "assistant", "content": "", "tool_calls": made}]
    template = read_template(folder, f"{name}.jinja")
    out, _ = render_jinja_template([messages], tools=tools, chat_template=template)
    text: str = out[0]
    return text[text.index("USERTURN"):]


_PARSERS = "_mlx_lm_tool_parsers"


def mlx_parser(kind: str) -> ModuleType:
    """mlx-lm's parser module `kind`, loaded from its file under a package of its own: mlx_lm's
    own `__init__` imports mlx; the parsers are text work."""
    if _PARSERS not in sys.modules:
        spec = importlib.util.find_spec("mlx_lm")  # finds it without importing it
        if spec is None or not spec.submodule_search_locations:
            pytest.skip("mlx-lm is not installed")
        folder = Path(list(spec.submodule_search_locations)[0]) / "tool_parsers"
        init = importlib.util.spec_from_file_location(
            _PARSERS, folder / "__init__.py", submodule_search_locations=[str(folder)])
        assert init is not None and init.loader is not None
        package = importlib.util.module_from_spec(init)
        sys.modules[_PARSERS] = package
        init.loader.exec_module(package)
    return importlib.import_module(f"{_PARSERS}.{kind}")


# ---- tools and calls ---------------------------------------------------------------------------
ITEM = {"type": "object", "properties": {"id": {"type": "integer"}, "tag": {"type": "string"}},
        "required": ["id"]}
WRITE = {"name": "write", "description": "Write a file.", "parameters": {
    "$defs": {"Item": ITEM, "Color": {"type": "string", "enum": ["red", "dark blue"]}},
    "type": "object",
    "properties": {
        "path": {"type": "string"},
        "content": {"type": "string"},
        "count": {"type": "integer"},
        "force": {"type": "boolean"},
        "mode": {"type": "string", "enum": ["w", "a"]},
        "meta": {"type": "object", "properties": {
            "tags": {"type": "array", "items": {"type": "string"}}, "depth": {"type": "number"}},
            "required": ["tags"]},
        "items": {"type": "array", "items": {"$ref": "#/$defs/Item"}},
        "first": {"$ref": "#/$defs/Item"},
        "color": {"$ref": "#/$defs/Color"},
        "note": {"type": "string"}},
    "required": ["path", "content", "count", "force", "mode", "meta", "items", "first",
                 "color"]}}
PING = {"name": "ping", "description": "Are you there?",  # no parameters (some templates
        "parameters": {"type": "object", "properties": {}}}  # print them: an empty schema)
TOOLS = [{"type": "function", "function": f} for f in (WRITE, PING)]

# Strings with newlines, `<` and `&` (no ", " or ": ", so compacting JSON leaves them), an
# integer, a boolean, an enum, nested objects and arrays, a $ref to an object and one to a
# string enum; `note`, optional, left out.
ARGS = {"path": "/tmp/a b.txt", "content": "line 1\n<b>&amp;</b> x", "count": 3, "force": True,
        "mode": "a", "meta": {"tags": ["x", "y"], "depth": 1.5},
        "items": [{"id": 1, "tag": "t"}, {"id": 2}], "first": {"id": 7}, "color": "dark blue"}
# Strings that look like other values, and whitespace at their ends: mlx-lm's parsers read
# some of these otherwise (`"42"` as 42, `"null"` as None, stripped text); `note` given.
EDGE = {"path": "42", "content": "\n  two\nlines \n", "count": -7, "force": False, "mode": "w",
        "meta": {"tags": []}, "items": [], "first": {"id": 0, "tag": "null"}, "color": "red",
        "note": "null"}
CALLS = [("write", ARGS), ("ping", {}), ("write", EDGE)]


@dataclass(frozen=True)
class Case:
    kind: str  # mlx-lm's parser module
    cls: type[Tagged]
    templates: tuple[str, ...]
    first: str  # a render's calls run from the first `first` after the user's turn ...
    last: str  # ... to the last `last`
    python_repr: bool = False  # the template prints objects as Python does (MiniCPM5)
    lossy: frozenset[str] = field(default_factory=frozenset)  # keys mlx-lm 0.32 reads otherwise

    def fmt(self, parse: Any = None) -> Tagged:
        """The format with mlx-lm's parser, or with `parse` (for its grammar alone)."""
        if parse is None:
            parse = mlx_parser(self.kind).parse_tool_call
        return self.cls(self.kind, *MARKERS[self.kind], parse)


MARKERS = {"qwen3_coder": ("<tool_call>", "</tool_call>"), "glm47": ("<tool_call>", "</tool_call>"),
           "laguna": ("<tool_call>", "</tool_call>"),
           "longcat": ("<longcat_tool_call>", "</longcat_tool_call>"),
           "minimax_m2": ("<minimax:tool_call>", "</minimax:tool_call>"),
           "minicpm5": ("<function name=", "</function>"),
           "kimi_k3": ("<|open|>tools<|sep|>", "<|close|>tools<|sep|>"),
           "muse_spark": ("<atem:function_calls>", "</atem:function_calls>")}

CASES = [
    Case("qwen3_coder", Qwen3Coder, ("Qwen3-Coder", "Qwen3.5-4B",
                                     "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "StepFun3.5-Flash"),
         "<tool_call>", "</tool_call>"),
    Case("glm47", Glm, ("GLM-4.6", "GLM-4.7-Flash"),
         "<tool_call>", "</tool_call>"),
    Case("laguna", Glm, ("poolside-Laguna-XS.2", "poolside-Laguna-XS-2.1",
                         "poolside-Laguna-S-2.1"), "<tool_call>", "</tool_call>"),
    # mlx-lm reads a parameter whose schema is a $ref as text
    Case("minimax_m2", Invoke, ("MiniMax-M2",), "<minimax:tool_call>", "</minimax:tool_call>",
         lossy=frozenset({"first"})),
    Case("minicpm5", MiniCpm5, ("openbmb-MiniCPM5-1B",), '<function name="', "</function>",
         python_repr=True, lossy=frozenset({"first"})),
    Case("kimi_k3", KimiK3, ("Kimi-K3",), "<|close|>response<|sep|>", "<|close|>tools<|sep|>"),
    Case("muse_spark", Muse, ("muse-glimmer",), " to=", "</atem:function_calls>"),
]
BY_TEMPLATE = [pytest.param(c, t, id=t) for c in CASES for t in c.templates]


def calls_text(folder: Path, case: Case, template: str, calls: list[tuple[str, Any]],
               tools: list[dict[str, Any]] = TOOLS) -> str:
    """The calls as the template renders them, JSON values compact (MiniCPM5's template prints
    objects as Python does: they are handed to it as compact JSON text, which the grammar
    writes instead)."""
    if case.python_repr:
        calls = [(n, {k: json.dumps(v, separators=(",", ":")) if isinstance(v, (dict, list))
                      else v for k, v in a.items()}) for n, a in calls]
    text = render(folder, template, calls, tools)
    text = text[text.index(case.first):text.rindex(case.last) + len(case.last)]
    return text if case.python_repr else text.replace(", ", ",").replace(": ", ":")


def grammar(case: Case, most: int = 3, functions: tuple[dict[str, Any], ...] = (WRITE, PING),
            strict: frozenset[str] = frozenset()) -> str:
    return case.fmt(parse=lambda t, _: []).grammar(Allowed(functions, most, strict), json.dumps,
                                                   "start")


# ---- the grammar writes what the template writes --------------------------------------------
@pytest.mark.parametrize(("case", "template"), BY_TEMPLATE)
def test_forced_calls_are_written_as_the_template_writes_them(templates: Path, case: Case,
                                                              template: str) -> None:
    text = calls_text(templates, case, template, CALLS)
    assert accepts(grammar(case), text), text
    assert not accepts(grammar(case, most=2), text)  # more calls than allowed


@pytest.mark.parametrize("case", CASES, ids=[c.kind for c in CASES])
def test_forced_calls_refuse_what_the_tools_do_not_allow(templates: Path, case: Case) -> None:
    template = case.templates[0]
    one = grammar(case, most=1)
    assert accepts(one, calls_text(templates, case, template, [("write", ARGS)]))
    strict = grammar(case, 1, (WRITE,), frozenset({"write"}))  # its schemas enforced whole
    assert accepts(strict, calls_text(templates, case, template, [("write", EDGE)]))
    missing = {k: v for k, v in ARGS.items() if k != "count"}
    for bad in ([("wrote", ARGS)], [("write", missing)], [("write", {**ARGS, "extra": 1})],
                [("write", {**ARGS, "count": 123456789012345678})],  # 18 digits
                [("write", {**ARGS, "mode": "x"})], [("write", {**ARGS, "force": "yes"})]):
        assert not accepts(one, calls_text(templates, case, template, bad)), bad
    for cut in case.fmt(parse=lambda t, _: []).cuts():  # where a parser would end the value
        bad = [("write", {**ARGS, "content": f"a{cut}b"})]
        assert not accepts(one, calls_text(templates, case, template, bad)), cut


# ---- and reads it back -----------------------------------------------------------------------
@pytest.mark.parametrize("cut", [3, 1000])
@pytest.mark.parametrize("case", CASES, ids=[c.kind for c in CASES])
def test_forced_calls_are_read_back_to_their_arguments(templates: Path, case: Case,
                                                       cut: int) -> None:
    """The whole turn through the splitter, by the format's table and parser; and mlx-lm's
    parser alone on each call's text, wherever it reads the format exactly."""
    had_mlx = "mlx.core" in sys.modules  # another test of this worker may have imported it
    text = calls_text(templates, case, case.templates[0], CALLS)
    fmt = case.fmt()
    initial, table = fmt.table(True)
    found = run(text, cut, Splitter(initial, table, fmt, TOOLS, 16))
    assert [(c.name, json.loads(c.arguments)) for c in found] == CALLS
    own = mlx_parser(case.kind).parse_tool_call
    one = calls_text(templates, case, case.templates[0], [("write", ARGS)])
    body = one[one.index(fmt.start) + len(fmt.start):one.rindex(fmt.end)] if fmt.end else one
    read = own(body, TOOLS)
    read = read[0] if isinstance(read, list) else read
    assert read["name"] == "write"
    assert {k: v for k, v in read["arguments"].items() if k not in case.lossy} == {
        k: v for k, v in ARGS.items() if k not in case.lossy}
    assert had_mlx or "mlx.core" not in sys.modules  # the parsers' files, not mlx_lm


OPTIONAL = {"name": "run", "description": "Run.", "parameters": {"type": "object", "properties": {
    "cwd": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},  # pydantic's
    "env": {"type": ["string", "null"]},
    "n": {"anyOf": [{"type": "integer"}, {"type": "string"}]}}, "required": ["env"]}}


@pytest.mark.parametrize("case", [c for c in CASES if c.cls is not KimiK3],
                         ids=[c.kind for c in CASES if c.cls is not KimiK3])
def test_a_string_or_null_is_raw_text_as_the_template_writes_it(templates: Path,
                                                                 case: Case) -> None:
    """Optional[str]: the template writes the text itself, and None as `null` (or Python's
    `None`), which reads back as None. A string in another union is JSON, quoted: raw, "7"
    could not be told from 7."""
    tools = [{"type": "function", "function": OPTIONAL}]
    calls = [("run", {"cwd": "/a b\n<c>", "env": None, "n": 7}), ("run", {"env": "x"})]
    text = calls_text(templates, case, case.templates[0], calls, tools)
    assert accepts(grammar(case, 2, (OPTIONAL,)), text)
    fmt = case.fmt()
    found = run(text, 7, Splitter(*fmt.table(True), fmt, tools, 16))
    assert [(c.name, json.loads(c.arguments)) for c in found] == calls
    one = grammar(case, 1, (OPTIONAL,))
    raw = calls_text(templates, case, case.templates[0], [("run", {"env": "x", "n": "a"})],
                     tools)
    assert not accepts(one, raw)
    quoted = raw.replace(">a<", '>"a"<').replace("\na\n", '\n"a"\n')  # as the grammar writes it
    assert accepts(one, quoted)
    read = run(quoted, 7, Splitter(*fmt.table(True), fmt, tools, 1))
    assert [json.loads(c.arguments) for c in read] == [{"env": "x", "n": "a"}]


def test_longcat_writes_glms_calls_with_its_own_tags(templates: Path) -> None:
    """No LongCat template at hand: GLM 4.7's render with LongCat's tags, as mlx-lm's parser
    reads them."""
    glm = CASES[1]
    text = calls_text(templates, glm, "GLM-4.7-Flash", CALLS)
    for tag in ("tool_call>", "arg_key>", "arg_value>"):
        text = text.replace(f"<{tag}", f"<longcat_{tag}").replace(f"</{tag}", f"</longcat_{tag}")
    case = Case("longcat", Glm, (), "", "")
    assert accepts(grammar(case), text)
    fmt = case.fmt()
    assert fmt.start == "<longcat_tool_call>"
    found = run(text, 5, Splitter(*fmt.table(True), fmt, TOOLS, 16))
    assert [(c.name, json.loads(c.arguments)) for c in found] == CALLS


def test_muse_calls_follow_its_headers_and_reasoning_is_a_message_to_itself(
        templates: Path) -> None:
    case = CASES[-1]
    fmt = case.fmt()
    call = calls_text(templates, case, "muse-glimmer", [("ping", {})])
    turn = f" to=self<|message|>Hm.<|eom|><|start|>assistant{call}<|eom|>"
    assert run(turn, 4, Splitter(*fmt.table(True), fmt, TOOLS, 16)) == [
        Thought("Hm."), ParsedCall("ping", "{}")]
    answer = " to=user<|message|>Hello.<|eot|>"
    assert run(answer, 4, Splitter(*fmt.table(True), fmt, TOOLS, 16)) == ["Hello."]
    assert run(turn, 4, Splitter(*fmt.table(False), fmt, None, 16)) == [Thought("Hm.")]
    lit = json.dumps
    assert fmt.thinking(lit) == (lit(" to=self<|message|>"), lit("<|eom|><|start|>assistant"))
    assert accepts(f"start: {fmt.answer(lit)} /[a-z]+/\n", " to=user<|message|>ok")


def test_kimi_k3_strips_its_structure_and_uses_a_json_block_for_unions(templates: Path) -> None:
    case = CASES[-2]
    fmt = case.fmt()
    text = "Sure.<|close|>response<|sep|><|close|>message<|sep|>"
    assert run(text, 3, Splitter(*fmt.table(False), fmt, None, 16)) == ["Sure."]
    union = {"name": "pick", "parameters": {"type": "object", "properties": {
        "v": {"anyOf": [{"type": "integer"}, {"type": "string"}]}}, "required": ["v"]}}
    tools = [{"type": "function", "function": union}]
    # the template writes arguments given as JSON text in a JSON block
    rendered = render(templates, "Kimi-K3", [("pick", '{"v":"a"}')], tools)
    block = rendered[rendered.index(case.first):rendered.rindex(case.last) + len(case.last)]
    assert '<|open|>json type="object"<|sep|>{"v":"a"}<|close|>json<|sep|>' in block
    assert accepts(grammar(case, 1, (union,)), block)
    assert not accepts(grammar(case, 1, (union,)), block.replace('"a"', "[]"))
    extra = {"name": "any", "parameters": {"type": "object", "additionalProperties": True}}
    assert accepts(grammar(case, 1, (extra,)), block.replace("pick", "any"))


class _Tokens:
    """One token per byte, an end token, and the given markers as special tokens."""

    def __init__(self, specials: list[str]) -> None:
        self.specials = {s: 257 + i for i, s in enumerate(specials)}
        self.tokens = [bytes([b]) for b in range(256)] + [b"</s>"] + [s.encode() for s in specials]
        self.eos_token_id, self.bos_token_id = 256, None
        self.special_token_ids = [256, *self.specials.values()]

    def __call__(self, text: str | bytes) -> list[int]:
        return list(text.encode() if isinstance(text, str) else text)

    def split(self, text: str) -> list[str]:
        pattern = "(" + "|".join(re.escape(s) for s in self.specials) + ")"
        return [part for part in re.split(pattern, text) if part]

    def lit(self, text: str) -> str:
        """As exod's Grammars.literal writes a marker: its special tokens as themselves."""
        return " ".join(f"<[{self.specials[p]}]>" if p in self.specials else json.dumps(p)
                        for p in self.split(text))

    def ids(self, text: str, spelled: str = "") -> list[int]:
        """`text` as tokens: its markers special, except inside `spelled`, written byte by
        byte as a model may spell a marker in text."""
        out: list[int] = []
        for part in text.split(spelled) if spelled else [text]:
            if out:
                out += list(spelled.encode())
            out += [i for p in self.split(part)
                    for i in ([self.specials[p]] if p in self.specials else list(p.encode()))]
        return out


def accepts_ids(grammar: str, tokens: _Tokens, ids: list[int]) -> bool:
    ll = llguidance.LLTokenizer(llguidance.TokenizerWrapper(tokens), slices=[])
    matcher = llguidance.LLMatcher(ll, grammar, log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    return matcher.consume_tokens(ids) and matcher.is_accepting()


@pytest.mark.parametrize(("case", "specials"), [
    (CASES[5], ["<|open|>", "<|sep|>", "<|close|>"]),
    (CASES[1], ["<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
                "</arg_value>"])], ids=["kimi_k3", "glm47"])
def test_markers_that_are_special_tokens_end_raw_text(templates: Path, case: Case,
                                                      specials: list[str]) -> None:
    """Kimi K3's XTML markers are special tokens, and GLM's tags may be: a value is any text
    up to the closing token, never the marker spelled as text, which its parser would cut on."""
    tokens = _Tokens(specials)
    fmt = case.fmt(parse=lambda t, _: [])
    forced = fmt.grammar(Allowed((WRITE, PING), 3), tokens.lit, "start")
    text = calls_text(templates, case, case.templates[-1], CALLS)
    assert accepts_ids(forced, tokens, tokens.ids(text))
    assert not accepts_ids(forced, tokens, tokens.ids(text.replace("x", "x" + fmt.shut, 1),
                                                      spelled=fmt.shut))


# ---- what cannot be forced -------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES, ids=[c.kind for c in CASES])
def test_a_pattern_or_format_cannot_be_enforced_on_raw_text(case: Case) -> None:
    """A strict tool's string with a `pattern` (or `format`) is refused, naming `tools`; a
    lenient tool's is written raw without it."""
    fn = {"name": "f", "parameters": {"type": "object", "properties": {
        "d": {"type": "string", "format": "date"}}, "required": ["d"]}}
    with pytest.raises(RequestError) as refused:
        grammar(case, 1, (fn,), frozenset({"f"}))
    assert refused.value.param == "tools"
    grammar(case, 1, (fn,))


@pytest.mark.parametrize("case", [c for c in CASES if c.cls is not KimiK3],
                         ids=[c.kind for c in CASES if c.cls is not KimiK3])
def test_tools_that_take_keys_beyond_their_properties_are_refused(case: Case) -> None:
    fn = {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "string"}},
                                      "additionalProperties": {"type": "integer"}}}
    with pytest.raises(RequestError) as refused:
        grammar(case, 1, (fn,))
    assert refused.value.param == "tools"
    spaced = {"name": "f", "parameters": {"type": "object", "properties": {"a b": {}}}}
    if case.cls is Qwen3Coder:  # `<parameter=a b>`: its parser ends a key at a space
        with pytest.raises(RequestError):
            grammar(case, 1, (spaced,))


# ---- format by format ------------------------------------------------------------------------
def test_minicpm5_writes_cdata_where_plain_text_would_not_read_back(templates: Path) -> None:
    case = CASES[4]
    one = grammar(case, 1, (WRITE,))
    padded = [("write", {**ARGS, "path": " padded "})]
    plain = calls_text(templates, case, "openbmb-MiniCPM5-1B", padded)
    assert '<param name="path"> padded </param>' in plain  # the template's: stripped when read
    assert not accepts(one, plain)
    cdata = plain.replace(" padded <", "<![CDATA[ padded ]]><")
    assert accepts(one, cdata)
    read = mlx_parser("minicpm5").parse_tool_call(cdata[len(case.fmt().start):], TOOLS)
    assert read["arguments"]["path"] == " padded "
    for bad in ("padded", "x</param>y"):  # needs no CDATA; ends the value for its parser
        assert not accepts(one, cdata.replace(" padded ", bad))


def test_qwen3_coder_reads_its_template_python_values() -> None:
    """Jinja's `| string` prints Python's `True` and `None`; a model trained on it writes so."""
    fmt = CASES[0].fmt(parse=lambda t, _: [])
    body = ("\n<function=write>\n<parameter=force>\nFalse\n</parameter>\n"
            "<parameter=meta>\n{'tags': ['a']}\n</parameter>\n<parameter=note>\nNone\n"
            "</parameter>\n</function>\n")
    assert json.loads(fmt.parse(body, TOOLS)[0].arguments) == {
        "force": False, "meta": {"tags": ["a"]}, "note": "None"}


def test_glm_reads_a_call_without_arguments_and_leaves_other_shapes_to_mlx_lm() -> None:
    fmt = CASES[1].fmt()
    assert fmt.parse("ping", TOOLS) == [ParsedCall("ping", "{}")]
    shaped = fmt.parse('{"name": "write", "arguments": {"count": 1}}', TOOLS)
    assert shaped == [ParsedCall("write", '{"count": 1}')]


def test_the_formats_are_found_by_mlx_lms_parser_names() -> None:
    assert {k: formats.KINDS[k] for k in MARKERS} == {
        "qwen3_coder": Qwen3Coder, "glm47": Glm, "laguna": Glm, "longcat": Glm,
        "minimax_m2": Invoke, "minicpm5": MiniCpm5, "kimi_k3": KimiK3, "muse_spark": Muse}
    for kind, (start, end) in MARKERS.items():
        module = mlx_parser(kind)
        assert (module.tool_call_start, module.tool_call_end) == (start, end)


@pytest.mark.parametrize("cut", [1, 4, 1000])
def test_qwen3_coders_call_without_its_block_is_read_never_shown(cut: int) -> None:
    """Qwen3-Coder sometimes leaves out `<tool_call>` (the raw XML ollama users saw in the
    answer): the call is read all the same, and the text around it stays text."""
    fmt = Qwen3Coder("qwen3_coder", "<tool_call>", "</tool_call>",
                     lambda text, tools: [])
    initial, table = fmt.table(True)
    text = ("I will look.\n<function=ping>\n</function>\n"
            "<function=write>\n<parameter=path>\n/a\n</parameter>\n</function> Done.")
    s = Splitter(initial, table, fmt, TOOLS, 16)
    assert run(text, cut, s) == ["I will look.\n", ParsedCall("ping", "{}"),
                                 ParsedCall("write", '{"path": "/a"}'), " Done."]
