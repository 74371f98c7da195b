"""The splitter (exod.runner.formats.splitter): answer, reasoning and calls out of streamed text,
in pieces cut anywhere, by a format's table, with the model's own parser handed in (here
json_tools' rule: the JSON between the markers). No markup ever reaches the answer: a call that
does not parse is dropped (and logged), never returned as text."""

from __future__ import annotations

import json
from typing import Any

import pytest

from exod.wire.options import GrammarLimits
from exod.runner.formats import MAX_CALLS, Splitter, Thought
from exod.runner.formats.base import ParsedCall, ToolFormat
from exod.runner.formats.json_body import JsonTools
from exod.runner.serving.strict_args import ArgsCheck

FMT = JsonTools("json_tools", "<tool_call>", "</tool_call>", lambda text, tools: json.loads(text))
TOOLS: list[dict[str, Any]] = []
TEXT = ('Let me look. <tool_call>\n{"name": "get", "arguments": {"city": "Oslo"}}\n</tool_call>'
        '\n<tool_call>{"name": "add", "arguments": "{\\"a\\": 1}"}</tool_call>\n')


def splitter(fmt: ToolFormat = FMT, most: int = MAX_CALLS, tools: bool = True,
             check: ArgsCheck | None = None) -> Splitter:
    initial, table = fmt.table(tools)
    return Splitter(initial, table, fmt, TOOLS if tools else None, most, "r", check)


def run(text: str, cut: int, s: Splitter | None = None) -> list[Any]:
    s = s or splitter()
    out: list[Any] = []
    for i in range(0, len(text), cut):
        out += s.feed(text[i:i + cut])
    out += s.flush()
    merged: list[Any] = []
    for p in out:  # pieces of text may come in several parts
        if isinstance(p, str) and merged and isinstance(merged[-1], str):
            merged[-1] += p
        elif isinstance(p, Thought) and merged and isinstance(merged[-1], Thought):
            merged[-1] = Thought(merged[-1].text + p.text)
        else:
            merged.append(p)
    return merged


@pytest.mark.parametrize("cut", [1, 2, 3, 7, 1000])
def test_calls_found_in_text_cut_anywhere(cut: int) -> None:
    # The whitespace between and after calls is no content.
    assert run(TEXT, cut) == ["Let me look. ", ParsedCall("get", '{"city": "Oslo"}'),
                              ParsedCall("add", '{"a": 1}')]


def test_a_call_that_does_not_parse_is_dropped_never_shown() -> None:
    s = splitter()
    assert run("a <tool_call>{not json}</tool_call> b", 4, s) == ["a  b"]
    assert s.dropped == 1 and s.made == 0


def test_a_call_cut_off_by_the_end_is_parsed_or_dropped() -> None:
    assert run('<tool_call>{"name": "x", "arguments": {}}', 5) == [ParsedCall("x", "{}")]
    assert run('ok <tool_call>{"name": "x", "argu', 5) == ["ok "]


def test_a_call_cut_by_max_tokens_is_dropped_even_where_it_would_parse() -> None:
    """Never arguments cut short: a call under way when max_tokens ends the generation is
    unfinished, whatever a lenient parser would make of it."""
    s = splitter()
    s.feed('<tool_call>{"name": "x", "arguments": {}}')
    assert s.flush(cut=True) == [] and s.dropped == 1


def test_a_marker_prefix_is_text_once_it_cannot_be_one() -> None:
    assert run("a <tool b <tool_cal", 2) == ["a <tool b <tool_cal"]


def test_without_tools_the_markers_are_text() -> None:
    assert run(TEXT, 3, splitter(tools=False)) == [TEXT]


@pytest.mark.parametrize("most", [1, 2])
def test_the_calls_allowed_end_the_generation(most: int) -> None:
    s = splitter(most=most)
    out = s.feed(TEXT * 2)
    assert [p for p in out if isinstance(p, ParsedCall)] == [
        ParsedCall("get", '{"city": "Oslo"}'), ParsedCall("add", '{"a": 1}')][:most] and s.done


def test_a_strict_tools_call_that_does_not_validate_is_dropped() -> None:
    """`strict: true` under `auto`: a call is checked against its tool's parameters once parsed
    (keys in any order); one that does not validate is dropped, as one that does not parse."""
    params = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                               "days": {"type": "integer", "maximum": 14}},
              "required": ["city"], "additionalProperties": False}
    tools = [{"type": "function", "function": {"name": "get", "parameters": params}},
             {"type": "function", "function": {"name": "add", "parameters": params}}]
    check = ArgsCheck(tools, ["get"], GrammarLimits())
    good = '<tool_call>{"name": "get", "arguments": {"days": 3, "city": "Oslo"}}</tool_call>'
    bad = '<tool_call>{"name": "get", "arguments": {"city": "Oslo", "days": 99}}</tool_call>'
    loose = '<tool_call>{"name": "add", "arguments": {"days": 99}}</tool_call>'  # not strict
    s = splitter(check=check)
    assert s.feed(good + bad + loose) + s.flush() == [
        ParsedCall("get", '{"days": 3, "city": "Oslo"}'), ParsedCall("add", '{"days": 99}')]
    assert s.dropped == 1


def test_reasoning_by_text_markers_of_several_tokens() -> None:
    """Gemma 4's think markers, `<|channel>thought` ... `<channel|>`, found as text, however the
    stream cuts them."""
    table = {"normal": [("<|channel>thought", "reasoning")],
             "reasoning": [("<channel|>", "normal")]}
    text = "<|channel>thought\nHm, weather.<channel|>It is sunny."
    for cut in (1, 2, 5, 100):
        s = Splitter("normal", table, None, None, MAX_CALLS)
        assert run(text, cut, s) == [Thought("\nHm, weather."), "It is sunny."]


def test_a_stray_end_marker_never_reaches_the_answer() -> None:
    """A random model writes the format's markers anywhere: one that ends no call is dropped."""
    assert run("a </tool_call> b", 3) == ["a  b"]
