"""The tool-call splitter (exod.runner.serving.tool_calls): text and calls out of streamed text,
in pieces cut anywhere, with the model's own parser handed in (here json_tools' rule: the JSON
between the markers). A call that does not parse comes back as the text it was."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from exod import messages as m
from exod.config.schema import GrammarLimits
from exod.runner.serving.strict_args import ArgsCheck
from exod.runner.serving.tool_calls import Call, ToolCallSplitter, ToolFormat, forced_grammar
from tests.unit.accepts import accepts

FMT = ToolFormat("<tool_call>", "</tool_call>", lambda text, tools: json.loads(text),
                 "json_tools")
TEXT = ('Let me look. <tool_call>\n{"name": "get", "arguments": {"city": "Oslo"}}\n</tool_call>'
        '\n<tool_call>{"name": "add", "arguments": "{\\"a\\": 1}"}</tool_call>\n')


def run(text: str, cut: int, fmt: ToolFormat = FMT, single: bool = False) -> list[Any]:
    s = ToolCallSplitter(fmt, [], single)
    out: list[Any] = []
    for i in range(0, len(text), cut):
        out += s.feed(text[i:i + cut])
    out += s.flush()
    merged: list[Any] = []
    for p in out:  # pieces of text may come in several parts
        if isinstance(p, str) and merged and isinstance(merged[-1], str):
            merged[-1] += p
        else:
            merged.append(p)
    return merged


@pytest.mark.parametrize("cut", [1, 2, 3, 7, 1000])
def test_calls_found_in_text_cut_anywhere(cut: int) -> None:
    # The whitespace between and after calls is no content.
    assert run(TEXT, cut) == ["Let me look. ", Call("get", '{"city": "Oslo"}'),
                              Call("add", '{"a": 1}')]


def test_a_call_that_does_not_parse_is_returned_as_text() -> None:
    text = "a <tool_call>{not json}</tool_call> b"
    assert run(text, 4) == [text]


def test_a_call_cut_off_by_the_end_is_parsed_or_returned() -> None:
    assert run('<tool_call>{"name": "x", "arguments": {}}', 5) == [Call("x", "{}")]
    assert run('<tool_call>{"name": "x", "argu', 5) == ['<tool_call>{"name": "x", "argu']


def test_a_marker_prefix_is_text_once_it_cannot_be_one() -> None:
    assert run("a <tool b <tool_cal", 2) == ["a <tool b <tool_cal"]


def test_single_stops_after_the_first_call() -> None:
    s = ToolCallSplitter(FMT, [], single=True)
    assert s.feed(TEXT) == ["Let me look. ", Call("get", '{"city": "Oslo"}')] and s.done


def test_an_empty_end_marker_means_calls_run_to_the_end() -> None:
    fmt = ToolFormat("[TOOL_CALLS]", "", lambda text, tools: json.loads(text), "mistral")
    assert run('hi [TOOL_CALLS][{"name": "a", "arguments": {}}, {"name": "b"}]', 3, fmt) == [
        "hi ", Call("a", "{}"), Call("b", "{}")]


def test_forced_grammar_is_the_models_format() -> None:
    tools = [{"type": "function", "function": {"name": "get", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}}}}},
             {"type": "function", "function": {"name": "add"}}]
    req = m.Generate(id="r", kind="chat", max_tokens=9, tools=tools, tool_choice="function",
                     tool_name="get", parallel_tool_calls=False)
    one = forced_grammar(FMT, req, json.dumps)
    call = '<tool_call>\n{"name":"get","arguments":{"a":1}}\n</tool_call>'
    assert accepts(one, call) and accepts(one, call.replace('"a":1', ""))
    for bad in (call.replace("get", "add"), call + "\n" + call, call.replace("1}", '1,"b":2}'),
                call.replace('"a":1', '"a":1 '), call.replace(":1", ":" + "1" * 18)):
        assert not accepts(one, bad), bad
    many = forced_grammar(FMT, m.Generate(id="r", kind="chat", max_tokens=9, tools=tools,
                                          tool_choice="required"), json.dumps)
    empty = '<tool_call>\n{"name":"add","arguments":{}}\n</tool_call>'
    assert accepts(many, call + "\n" + empty) and not accepts(many, empty.replace("{}", '{"x":1}'))


def test_a_forced_mistral_call_is_an_array_of_calls() -> None:
    fmt = ToolFormat("[TOOL_CALLS]", "", lambda text, tools: json.loads(text), "mistral")
    tools = [{"type": "function", "function": {"name": "get", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}]
    req = m.Generate(id="r", kind="chat", max_tokens=9, tools=tools, tool_choice="required")
    call = '{"name":"get","arguments":{"a":1}}'
    assert accepts(forced_grammar(fmt, req, json.dumps), f"[TOOL_CALLS][{call},{call}]")
    single = forced_grammar(fmt, replace(req, parallel_tool_calls=False), json.dumps)
    assert accepts(single, f"[TOOL_CALLS][{call}]")
    for bad in (f"[TOOL_CALLS][{call},{call}]", f"[TOOL_CALLS] [{call}]",
                f"[TOOL_CALLS][{call.replace(':1', ': 1')}]"):
        assert not accepts(single, bad), bad


def test_a_tools_local_refs_resolve_in_its_own_parameters() -> None:
    """pydantic puts nested models in `$defs`: the arguments are a schema's root, so
    `#/$defs/...` points where the client meant (it pointed to nothing inside the call)."""
    params = {"$defs": {"A": {"type": "object", "properties": {"x": {"type": "integer"}},
                              "required": ["x"]}},
              "type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}, "required": ["a"]}
    req = m.Generate(id="r", kind="chat", max_tokens=9, tool_choice="required",
                     tools=[{"type": "function", "function": {"name": "f", "parameters": params}}])
    grammar = forced_grammar(FMT, req, json.dumps)
    call = '<tool_call>\n{"name":"f","arguments":{"a":{"x":1}}}\n</tool_call>'
    assert accepts(grammar, call) and not accepts(grammar, call.replace("1", '"1"'))


def test_a_strict_tools_call_that_does_not_validate_is_returned_as_text() -> None:
    """`strict: true` under `auto`: a call is checked against its tool's parameters once parsed
    (keys in any order); one that does not validate comes back as the text it was."""
    params = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                               "days": {"type": "integer", "maximum": 14}},
              "required": ["city"], "additionalProperties": False}
    tools = [{"type": "function", "function": {"name": "get", "parameters": params}},
             {"type": "function", "function": {"name": "add", "parameters": params}}]
    check = ArgsCheck(tools, ["get"], GrammarLimits())
    good = '<tool_call>{"name": "get", "arguments": {"days": 3, "city": "Oslo"}}</tool_call>'
    bad = '<tool_call>{"name": "get", "arguments": {"city": "Oslo", "days": 99}}</tool_call>'
    loose = '<tool_call>{"name": "add", "arguments": {"days": 99}}</tool_call>'  # not strict
    s = ToolCallSplitter(FMT, tools, False, check=check)
    assert s.feed(good + bad + loose) + s.flush() == [
        Call("get", '{"days": 3, "city": "Oslo"}'), bad, Call("add", '{"days": 99}')]
