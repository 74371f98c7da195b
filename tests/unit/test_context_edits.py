"""Anthropic's context editing as deterministic edits of the prompt (exod.core.context_edits),
and where a system turn goes for templates that take one only first. The token count is a
double here (one token per character of content): the runner counts with the model's own."""

from __future__ import annotations

from typing import Any

import pytest

from exod.core import context_edits as ce
from exod.core.request_rules import RequestError
from exod.wire.messages import Generate
from exod.runner.serving.prepare import edited_prompt


def count(messages: list[dict[str, Any]]) -> int:
    return sum(len(str(m.get("content", ""))) + len(str(m.get("reasoning_content", "")))
               + len(str(m.get("tool_calls", ""))) for m in messages)


def turn(i: int, tool: str = "Read", thought: str = "") -> list[dict[str, Any]]:
    call = {"id": f"c{i}", "type": "function",
            "function": {"name": tool, "arguments": {"path": f"/f{i}"}}}
    assistant: dict[str, Any] = {"role": "assistant", "content": "", "tool_calls": [call]}
    if thought:
        assistant["reasoning_content"] = thought
    return [assistant, {"role": "tool", "tool_call_id": f"c{i}", "content": "x" * 100}]


CONVO = [{"role": "user", "content": "go"}, *turn(1, thought="a"), *turn(2, "Bash", "b"),
         *turn(3, thought="c"), *turn(4, thought="d")]


def edit(raw: dict[str, Any]) -> dict[str, Any]:
    return ce.edit(raw, raw["type"], "context_management.edits[0]")


def test_clear_thinking_keeps_the_latest_turns_thinking() -> None:
    out, applied = ce.apply(CONVO, [edit({"type": ce.THINKING, "keep": {
        "type": "thinking_turns", "value": 1}})], count)
    assert [m.get("reasoning_content") for m in out if m["role"] == "assistant"] == \
        [None, None, None, "d"]
    assert applied == [{"type": ce.THINKING, "cleared_thinking_turns": 3,
                        "cleared_input_tokens": 3}]
    assert CONVO[1]["reasoning_content"] == "a"  # the client's history is not touched


def test_clear_thinking_keep_all_changes_nothing() -> None:
    """What Claude Code sends on every request."""
    assert ce.apply(CONVO, [edit({"type": ce.THINKING, "keep": "all"})], count) == (CONVO, [])
    assert edit({"type": ce.THINKING}) == {"type": ce.THINKING, "keep": 1}


def test_clear_tool_uses_past_the_trigger_keeps_the_latest_and_the_excluded() -> None:
    e = edit({"type": ce.TOOL_USES, "trigger": {"type": "input_tokens", "value": 100},
              "keep": {"type": "tool_uses", "value": 1}, "exclude_tools": ["Bash"]})
    out, applied = ce.apply(CONVO, [e], count)
    results = [m["content"] for m in out if m["role"] == "tool"]
    assert results == [ce.PLACEHOLDER, "x" * 100, ce.PLACEHOLDER, "x" * 100]
    assert applied[0]["type"] == ce.TOOL_USES and applied[0]["cleared_tool_uses"] == 2
    assert applied[0]["cleared_input_tokens"] == count(CONVO) - count(out)


def test_clear_tool_uses_below_its_trigger_or_clear_at_least_changes_nothing() -> None:
    below = edit({"type": ce.TOOL_USES, "trigger": {"type": "input_tokens",
                                                    "value": count(CONVO)}})
    assert ce.apply(CONVO, [below], count) == (CONVO, [])
    assert ce.apply(CONVO, [edit({"type": ce.TOOL_USES})], count) == (CONVO, [])  # 100k
    greedy = edit({"type": ce.TOOL_USES, "trigger": {"type": "tool_uses", "value": 2},
                   "keep": {"type": "tool_uses", "value": 3},
                   "clear_at_least": {"type": "input_tokens", "value": 10_000}})
    assert ce.apply(CONVO, [greedy], count) == (CONVO, [])


def test_a_conversation_is_counted_once_and_an_edit_tried_once_on_it() -> None:
    """Counting is the template and the tokenizer over the whole conversation, in the runner:
    16 edits that never applied (their clear_at_least out of reach) counted it 48 times, 41
    times the cost of the prompt itself (82 s for 0.7 MB of tool results)."""
    calls: list[int] = []

    def counting(messages: list[dict[str, Any]]) -> int:
        calls.append(1)
        return count(messages)

    def unreachable(keep: int) -> dict[str, Any]:
        return edit({"type": ce.TOOL_USES, "trigger": {"type": "input_tokens", "value": 0},
                     "keep": {"type": "tool_uses", "value": keep},
                     "clear_at_least": {"type": "input_tokens", "value": 10**9}})
    assert ce.apply(CONVO, [unreachable(0)] * 16, counting) == (CONVO, [])
    assert len(calls) == 2  # the conversation, and what the one edit tried made of it
    calls.clear()
    assert ce.apply(CONVO, [unreachable(k % 3) for k in range(16)], counting) == (CONVO, [])
    assert len(calls) == 1 + 3
    # An edit that applies makes a new conversation, on which the same edit is tried again.
    again = edit({"type": ce.TOOL_USES, "trigger": {"type": "tool_uses", "value": 0},
                  "keep": {"type": "tool_uses", "value": 0}})
    assert len(ce.apply(CONVO, [again, again], count)[1]) == 2


def test_the_runner_renders_the_prompt_it_counted_once() -> None:
    """The runner counts with the template and the tokenizer (exod.runner.serving.prepare):
    the prompt it ends with is one it counted, not rendered a third time."""
    class Tokenizer:
        renders = 0

        def apply_chat_template(self, messages: list[dict[str, Any]], **_: Any) -> list[int]:
            self.renders += 1
            return [1] * count(messages)

    unreachable = edit({"type": ce.TOOL_USES, "trigger": {"type": "input_tokens", "value": 0},
                        "clear_at_least": {"type": "input_tokens", "value": 10**9}})
    tok = Tokenizer()
    req = Generate(id="r", kind="chat", messages=CONVO, max_tokens=1,
                   context_edits=[unreachable] * 16)
    assert edited_prompt(tok, req) == ([1] * count(CONVO), [])
    assert tok.renders == 2  # the conversation, and what the edit made of it


def test_clear_tool_inputs_empties_the_calls_arguments() -> None:
    e = edit({"type": ce.TOOL_USES, "trigger": {"type": "tool_uses", "value": 0},
              "keep": {"type": "tool_uses", "value": 0}, "clear_tool_inputs": ["Bash"]})
    out, _ = ce.apply(CONVO, [e], count)
    args = [m["tool_calls"][0]["function"]["arguments"] for m in out if m.get("tool_calls")]
    assert args == [{"path": "/f1"}, {}, {"path": "/f3"}, {"path": "/f4"}]


@pytest.mark.parametrize("raw, param", [
    ({"type": ce.THINKING, "keep": {"type": "tool_uses", "value": 1}}, "keep.type"),
    ({"type": ce.THINKING, "keep": {"type": "thinking_turns", "value": -1}}, "keep.value"),
    ({"type": ce.TOOL_USES, "trigger": {"type": "messages", "value": 3}}, "trigger.type"),
    ({"type": ce.TOOL_USES, "exclude_tools": "Bash"}, "exclude_tools"),
    ({"type": ce.TOOL_USES, "clear_tool_inputs": [3]}, "clear_tool_inputs[0]"),
])
def test_an_edit_is_checked_naming_its_field(raw: dict[str, Any], param: str) -> None:
    with pytest.raises(RequestError) as e:
        edit(raw)
    assert e.value.param == f"context_management.edits[0].{param}"


def test_system_turns_join_the_leading_one_only_when_some_are_elsewhere() -> None:
    plain = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    assert ce.system_first(plain) is plain
    moved = ce.system_first([{"role": "user", "content": "u"},
                             {"role": "system", "content": "env"},
                             {"role": "assistant", "content": "a"},
                             {"role": "system", "content": "more"}])
    assert moved == [{"role": "system", "content": "env\n\nmore"},
                     {"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
