"""Formats whose calls carry JSON arguments (exod.runner.formats.json_body) and harmony
(exod.runner.formats.harmony): each parses the calls its model writes, in every generation of
the format, and forces calls with a grammar that writes them as the model's template does.
Grammars are checked by the engine one byte a token (tests.unit.accepts), markers as text."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from exod.runner.formats import Splitter, Thought
from exod.runner.formats.base import Allowed, ParsedCall, calls_of
from exod.runner.formats.harmony import Harmony, parse_tool_call
from exod.runner.formats.json_body import JsonTools, KimiK2, Mistral
from tests.unit.accepts import accepts
from tests.unit.test_tool_calls import run

GET = {"name": "get", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}},
                                     "required": ["a"]}}
ADD = {"name": "add"}
TOOLS = [{"type": "function", "function": f} for f in (GET, ADD)]


def mistral_parse(text: str, tools: Any) -> Any:  # mlx-lm's rule for the array generation
    return json.loads(text)


def mistral(template: str) -> Mistral:
    return Mistral("mistral", "[TOOL_CALLS]", "", mistral_parse, template)


def split(fmt: Any, text: str, cut: int, most: int = 16, tools: bool = True) -> list[Any]:
    initial, table = fmt.table(tools)
    return run(text, cut, Splitter(initial, table, fmt, TOOLS if tools else None, most))


def test_json_tools_forced_one_named_call() -> None:
    fmt = JsonTools("json_tools", "<tool_call>", "</tool_call>", lambda t, _: json.loads(t))
    one = fmt.grammar(Allowed((GET,), 1), json.dumps, "start")
    call = '<tool_call>\n{"name":"get","arguments":{"a":1}}\n</tool_call>'
    assert accepts(one, call)
    for bad in (call.replace("get", "add"), call + "\n" + call, call.replace("1}", '1,"b":2}'),
                call.replace('"a":1', '"a":1 '), call.replace(":1", ":" + "1" * 18),
                call.replace('"a":1', "")):
        assert not accepts(one, bad), bad
    many = fmt.grammar(Allowed((GET, ADD), 3), json.dumps, "start")
    empty = '<tool_call>\n{"name":"add","arguments":{}}\n</tool_call>'
    assert accepts(many, call + "\n" + empty) and accepts(many, "\n".join([call] * 3))
    assert not accepts(many, "\n".join([call] * 4))


def test_a_tools_local_refs_resolve_in_its_own_parameters() -> None:
    """pydantic puts nested models in `$defs`: the arguments are a schema's root, so
    `#/$defs/...` points where the client meant."""
    params = {"$defs": {"A": {"type": "object", "properties": {"x": {"type": "integer"}},
                              "required": ["x"]}},
              "type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}, "required": ["a"]}
    fmt = JsonTools("json_tools", "<tool_call>", "</tool_call>", lambda t, _: json.loads(t))
    grammar = fmt.grammar(Allowed(({"name": "f", "parameters": params},), 1), json.dumps,
                          "start")
    call = '<tool_call>\n{"name":"f","arguments":{"a":{"x":1}}}\n</tool_call>'
    assert accepts(grammar, call) and not accepts(grammar, call.replace("1", '"1"'))


SMALL_32 = "{{- '[TOOL_CALLS]' + name }}{{- '[CALL_ID]' + id }}{{- '[ARGS]' + args }}"
DEVSTRAL = "{{- '[TOOL_CALLS]' + name + '[ARGS]' + args }}"
NEMO = '{{- "[TOOL_CALLS][" }}'


@pytest.mark.parametrize("cut", [1, 3, 1000])
def test_mistral_calls_of_each_generation_are_parsed_with_their_ids(cut: int) -> None:
    fmt = mistral(SMALL_32)
    text = ('[TOOL_CALLS]get[CALL_ID]aB3dE6gH9[ARGS]{"a": 1}'
            '[TOOL_CALLS]add[CALL_ID]zz[ARGS]{}')
    first, second = split(fmt, text, cut)
    assert first == ParsedCall("get", '{"a": 1}', "aB3dE6gH9")
    assert (second.name, second.arguments, len(second.id)) == ("add", "{}", 9)
    assert second.id.isalnum()  # the model's id was not nine characters: one is made
    assert split(mistral(DEVSTRAL), '[TOOL_CALLS]get[ARGS]{"a": 2}', cut)[0].name == "get"
    array = '[TOOL_CALLS][{"name": "get", "arguments": {"a": 3}}]'
    assert split(mistral(NEMO), array, cut) == [ParsedCall("get", '{"a": 3}')]


def test_mistral_forced_calls_are_written_as_its_template_writes_them() -> None:
    one, two = Allowed((GET,), 1), Allowed((GET,), 2)
    call = '[TOOL_CALLS]get[CALL_ID]aB3dE6gH9[ARGS]{"a":1}'
    grammar = mistral(SMALL_32).grammar(one, json.dumps, "start")
    assert accepts(grammar, call)
    for bad in (call.replace("aB3dE6gH9", "aB3"), call.replace("[CALL_ID]aB3dE6gH9", ""),
                call + call, '[TOOL_CALLS][{"name":"get","arguments":{"a":1}}]'):
        assert not accepts(grammar, bad), bad
    assert accepts(mistral(SMALL_32).grammar(two, json.dumps, "start"), call + call)
    assert accepts(mistral(DEVSTRAL).grammar(one, json.dumps, "start"),
                   '[TOOL_CALLS]get[ARGS]{"a":1}')
    body = '{"name":"get","arguments":{"a":1}}'
    assert accepts(mistral(NEMO).grammar(two, json.dumps, "start"), f"[TOOL_CALLS][{body},{body}]")


def test_mistral_ids_become_nine_letters_and_digits_for_its_template() -> None:
    conversation = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_0123456789abcdef", "type": "function",
             "function": {"name": "get", "arguments": {"a": 1}}},
            {"id": "aB3dE6gH9", "type": "function", "function": {"name": "add", "arguments": {}}}]},
        {"role": "tool", "tool_call_id": "call_0123456789abcdef", "content": "1"},
        {"role": "tool", "tool_call_id": "aB3dE6gH9", "content": "2"}]
    out = mistral(SMALL_32).messages(conversation)
    made = out[1]["tool_calls"][0]["id"]
    assert len(made) == 9 and made.isalnum() and out[2]["tool_call_id"] == made
    assert out[1]["tool_calls"][1]["id"] == out[3]["tool_call_id"] == "aB3dE6gH9"
    assert mistral(DEVSTRAL).messages(conversation) is conversation


def test_kimi_k2_numbers_its_calls_across_the_conversation() -> None:
    fmt = KimiK2("kimi_k2", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
                 lambda t, _: [])
    grammar = fmt.grammar(Allowed((GET, ADD), 2, earlier=3), json.dumps, "start")
    call = ('<|tool_call_begin|>functions.get:{n}<|tool_call_argument_begin|>{{"a":1}}'
            "<|tool_call_end|>")
    head, tail = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
    assert accepts(grammar, head + call.format(n=3) + tail)
    assert accepts(grammar, head + call.format(n=3) + call.format(n=4) + tail)
    assert not accepts(grammar, head + call.format(n=0) + tail)
    assert not accepts(grammar, head + call.format(n=3) * 2 + tail)


HARMONY = Harmony("harmony", "to=", "<|call|>", parse_tool_call)
TURN = ("<|channel|>analysis<|message|>Need the weather.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get <|constrain|>json<|message|>"
        '{"a":1}')  # <|call|> is an end-of-sequence token: never in the text


@pytest.mark.parametrize("cut", [1, 2, 5, 1000])
def test_harmony_channels_are_reasoning_calls_and_answer(cut: int) -> None:
    assert split(HARMONY, TURN, cut) == [Thought("Need the weather."),
                                         ParsedCall("get", '{"a": 1}')]
    final = ("<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant"
             "<|channel|>final<|message|>It is 4.")
    assert split(HARMONY, final, cut) == [Thought("Easy."), "It is 4."]
    preamble = "<|channel|>commentary<|message|>Looking it up.<|end|>"
    assert split(HARMONY, preamble, cut) == ["Looking it up."]


def test_harmony_reads_the_recipient_before_the_channel_too() -> None:
    """gpt-oss's template writes past calls that way; a model may too."""
    text = ('<|start|>assistant to=functions.add<|channel|>commentary json<|message|>{}'
            "<|call|>")
    assert split(HARMONY, text, 3) == [ParsedCall("add", "{}")]


def test_harmony_calls_without_tools_and_to_builtins_are_dropped() -> None:
    assert split(HARMONY, TURN, 4, tools=False) == [Thought("Need the weather.")]
    python = "<|channel|>analysis to=python<|message|>print(1)<|call|>"
    assert split(HARMONY, python, 4) == []


def test_harmony_forces_one_call_with_constrain_json() -> None:
    grammar = HARMONY.grammar(Allowed((GET, ADD), 1), json.dumps, "start")
    call = ('<|channel|>commentary to=functions.get <|constrain|>json<|message|>{"a":1}'
            "<|call|>")
    assert accepts(grammar, call)
    assert not accepts(grammar, call.replace("<|constrain|>json", "json"))
    assert not accepts(grammar, call.replace('{"a":1}', "{}"))
    parsed = parse_tool_call(call.split("to=", 1)[1], None)
    assert calls_of(parsed) == [ParsedCall("get", '{"a": 1}')]


def test_harmony_conversation_one_call_a_message_and_thinking() -> None:
    """gpt-oss's template renders one call an assistant message, names a result after the
    call before it, and reads reasoning under `thinking`."""
    calls = [{"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": {}}}
             for i, n in enumerate(("get", "add"))]
    conversation = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Both.", "reasoning_content": "Two tools.",
         "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c0", "content": "1"},
        {"role": "tool", "tool_call_id": "c1", "content": "2"}]
    out = HARMONY.messages(conversation)
    assert [(m["role"], [c["id"] for c in m.get("tool_calls") or []] or m.get("tool_call_id"))
            for m in out] == [("user", None), ("assistant", ["c0"]), ("tool", "c0"),
                              ("assistant", ["c1"]), ("tool", "c1")]
    assert out[1]["thinking"] == "Two tools.\n\nBoth." and out[1]["content"] == ""
    assert "reasoning_content" not in out[1]
    assert replace(HARMONY).messages(conversation[:1]) == conversation[:1]


def test_harmony_markers_that_stray_into_the_answer_are_dropped() -> None:
    text = ("<|channel|>final<|message|>It is<|constrain|> 4.<|message|>"
            "<|channel|>commentary<|message|> Done.")
    assert split(HARMONY, text, 2) == ["It is 4. Done."]


def test_harmony_joins_every_system_turn_into_the_first() -> None:
    """gpt-oss's template renders only a first system turn (as the developer message) and
    drops any later one: Claude Code sends its environment in a system turn after the user's."""
    out = HARMONY.messages([{"role": "system", "content": "A"}, {"role": "user", "content": "u"},
                            {"role": "system", "content": "B"}])
    assert out == [{"role": "system", "content": "A\n\nB"}, {"role": "user", "content": "u"}]
