"""The dialect adapters' pure translation (exod.api.dialects), a rule per test: Anthropic
Messages and OpenAI Responses requests into chat completions bodies, the one typed reply
(whole, or its pieces) into each dialect's answers and events, with one table of stop reasons,
and the core's errors in each dialect's field names. No processes, no sockets (test_dialects
drives them end to end)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from exod.wire import messages as m
from exod.api.dialects.anthropic import request as anthropic
from exod.api.dialects.responses import request as responses
from exod.api.dialects.anthropic.output import AnthropicOutput, CountOutput
from exod.api.dialects.responses.output import ResponsesOutput
from exod.api.errors import ApiError, bad_request, not_ready, queue_full
from exod.api.reply import Call, Called, Finished, Piece, Reply, Usage
from exod.api.request import GenRequest
from exod.api.seal import Sealer
from exod.api.stop_reasons import STOP_REASONS, StopReason
from exod.wire.messages import Generate

HI: list[Any] = [{"role": "user", "content": "hi"}]
TOOL: dict[str, Any] = {"name": "get", "description": "d",
                        "input_schema": {"type": "object", "properties": {}}}
SEALER = Sealer(key=b"k" * 32)


def parse_claude(body: dict[str, Any], **kw: Any) -> tuple[GenRequest, anthropic.AnthropicView]:
    return anthropic.parse(body, SEALER, **kw)


def claude_req(**body: Any) -> GenRequest:
    return parse_claude({"model": "m", "max_tokens": 8, "messages": HI, **body})[0]


def claude(**body: Any) -> Generate:
    return claude_req(**body).gen


def refused(fn: Any, *args: Any, **kw: Any) -> ApiError:
    with pytest.raises(ApiError) as e:
        fn(*args, **kw)
    assert e.value.status == 400
    assert e.value.param is None or f"`{e.value.param}" in e.value.message
    return e.value


def says(fn: Any, *args: Any, **kw: Any) -> str | None:
    """The parameter a refusal names."""
    return refused(fn, *args, **kw).param


def user(*blocks: Any) -> list[Any]:
    return [{"role": "user", "content": list(blocks)}]


# ---- Anthropic Messages requests ----------------------------------------------------------------
def test_messages_top_level_fields_work_have_no_effect_are_ignored_or_are_refused() -> None:
    plain = claude_req()
    hinted = claude_req(metadata={"user_id": '{"session": 1}'}, service_tier="auto",
                        cache_control={"type": "ephemeral"}, speed="fast", betas=["x"],
                        context_management={"edits": []})
    assert hinted.gen == plain.gen and hinted.ignored == ()
    # Unknown fields (new client versions add them) are accepted and reported (issue 27).
    assert claude_req(brand_new={"a": 1}).ignored == ("brand_new",)
    assert says(parse_claude, {"model": "m", "max_tokens": 8, "messages": HI, "x": 1},
                strict=True) == "x"
    assert says(claude, container="c") == "container"
    assert says(claude, mcp_servers=[{"type": "url"}]) == "mcp_servers"
    assert says(parse_claude, {"model": "m", "messages": HI}) == "max_tokens"
    assert says(claude, max_tokens=0) == "max_tokens"
    assert says(claude, messages=[]) == "messages"
    # count_tokens takes what shapes the prompt; max_tokens is none of it (ignored).
    counted = parse_claude({"model": "m", "max_tokens": 3, "messages": HI}, count_only=True)[0]
    assert counted.gen.count_only and counted.gen.max_tokens == 1
    assert counted.ignored == ("max_tokens",)
    refused(parse_claude, [])


def test_messages_sampling_stop_and_stream_fields_map_onto_the_request() -> None:
    req = claude_req(stop_sequences=["x"], temperature=0, top_p=0.5, top_k=3, stream=True)
    g = req.gen
    assert (g.max_tokens, g.stop, g.temperature, g.top_p, g.top_k) == (8, ["x"], 0.0, 0.5, 3)
    assert req.stream and req.include_usage and g.messages == HI


def test_agents_max_tokens_passes_the_parse_and_is_clamped_against_the_model() -> None:
    """Claude Code sends max_tokens 32000 on any model: apply_limits clamps it."""
    from exod.api.request import ModelLimits, apply_limits
    req = claude_req(max_tokens=32000)
    assert apply_limits(req, ModelLimits(context=2048, cap=None)).gen.max_tokens == 2048
    assert apply_limits(req, ModelLimits(context=2048, cap=64)).gen.max_tokens == 64


def test_system_as_a_string_or_text_blocks_comes_first() -> None:
    assert claude(system="s").messages[0] == {"role": "system", "content": "s"}
    blocks = [{"type": "text", "text": "a"}, {"type": "text", "text": "b",
                                              "cache_control": {"type": "ephemeral"}}]
    assert claude(system=blocks).messages[0] == {"role": "system", "content": "a\n\nb"}
    assert says(claude, system=[{"type": "image"}]) == "system[0].type"
    assert claude_req(system=[{"type": "text", "text": "a", "x": 1}]).ignored == ("system[].x",)


def test_a_system_turn_in_messages_stays_in_place_for_the_runner_to_place() -> None:
    """Claude Code sends its environment as a system turn inside `messages`; the runner joins
    it to the leading system turn when the template takes one only first (test_fields)."""
    msgs = claude(system="s", messages=[*HI, {"role": "system", "content": [
        {"type": "text", "text": "env"}]}]).messages
    assert msgs == [{"role": "system", "content": "s"}, *HI,
                    {"role": "system", "content": "env"}]


def test_a_user_turn_s_tool_results_become_tool_messages_before_its_text() -> None:
    g = claude(messages=user({"type": "text", "text": "and"},
                             {"type": "tool_result", "tool_use_id": "t", "content": "r"},
                             {"type": "tool_result", "tool_use_id": "u", "is_error": True,
                              "content": [{"type": "text", "text": "bad"}]}))
    assert g.messages == [{"role": "tool", "content": "r", "tool_call_id": "t"},
                          {"role": "tool", "content": "Error: bad", "tool_call_id": "u"},
                          {"role": "user", "content": "and"}]
    assert says(claude, messages=user({"type": "tool_result", "tool_use_id": "t",
                                       "is_error": "yes"})) == "messages[0].content[0].is_error"
    assert says(claude, messages=user({"type": "document", "source": {}})) == \
        "messages[0].content[0].type"


def test_an_assistant_turn_s_blocks_become_its_text_reasoning_and_calls() -> None:
    turn = [{"type": "thinking", "thinking": "hmm", "signature": "s"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "text", "text": "ok"},
            {"type": "tool_use", "id": "t", "name": "get", "input": {"a": 1}}]
    (msg,) = claude(messages=[{"role": "assistant", "content": turn}]).messages
    assert msg == {"role": "assistant", "content": "ok", "reasoning_content": "hmm",
                   "tool_calls": [{"id": "t", "type": "function",
                                   "function": {"name": "get", "arguments": {"a": 1}}}]}
    bad = [{"type": "tool_use", "id": "t", "name": "get", "input": "x"}]
    assert says(claude, messages=[{"role": "assistant", "content": bad}]) == \
        "messages[0].content[0].input"
    assert claude_req(messages=[{"role": "user", "content": "a", "name": "x"}]).ignored == \
        ("messages[].name",)


def test_an_omitted_thinking_block_gets_its_text_back_from_its_signature() -> None:
    """`display: omitted` returns thinking blocks with empty text and a signature that seals
    it: sent back, the text reaches the template; a foreign signature is reported."""
    sealed = {"type": "thinking", "thinking": "", "signature": SEALER.seal("deep")}
    (msg,) = claude(messages=[{"role": "assistant", "content": [sealed]}]).messages
    assert msg["reasoning_content"] == "deep"
    foreign = claude_req(messages=[{"role": "assistant", "content": [
        {**sealed, "signature": "EqQBCkYIBxgC"}]}])
    assert "reasoning_content" not in foreign.gen.messages[0]
    assert foreign.ignored == ("messages[].content[].signature",)


@pytest.mark.parametrize("block, outcome", [
    ({"type": "text", "text": "a", "cache_control": {"type": "ephemeral", "ttl": "1h"}}, ()),
    ({"type": "text", "text": "a", "citations": None}, ()),
    ({"type": "text", "text": "a", "citations": []}, ()),
    ({"type": "text", "text": "a", "citations": [{"type": "char_location"}]}, "citations"),
    ({"type": "text", "text": "a", "colour": "red"}, ("messages[].content[].colour",)),
    ({"type": "tool_result", "tool_use_id": "t", "content": "r", "toolset_name": None}, ()),
    ({"type": "tool_result", "tool_use_id": "t", "content": "r", "toolset_name": "mcp"},
     "toolset_name"),
    ({"type": "server_tool_use", "id": "s", "name": "web_search", "input": {}},
     ("messages[].content[].type=server_tool_use",)),
])
def test_a_content_block_key_works_is_harmless_ignored_or_refused_by_name(
        block: dict[str, Any], outcome: Any) -> None:
    if isinstance(outcome, str):
        assert says(claude, messages=user(block)) == f"messages[0].content[0].{outcome}"
    else:
        assert claude_req(messages=user(block)).ignored == outcome


@pytest.mark.parametrize("caller, accepted", [
    (None, True), ({"type": "direct"}, True), ({"type": "code_execution_20250825"}, False)])
def test_a_tool_use_s_caller_is_the_model_itself(caller: Any, accepted: bool) -> None:
    block = {"type": "tool_use", "id": "t", "name": "get", "input": {}, "caller": caller}
    body = [{"role": "assistant", "content": [block]}]
    if accepted:
        claude(messages=body)
    else:
        assert says(claude, messages=body) == "messages[0].content[0].caller"


def test_tools_map_onto_function_tools_server_tools_are_not_offered() -> None:
    req = claude_req(tools=[{**TOOL, "strict": True, "cache_control": {"type": "ephemeral"},
                             "eager_input_streaming": True, "defer_loading": False},
                            {"type": "web_search_20250305", "name": "web_search"},
                            {"type": "bash_20250124", "name": "bash"}])
    assert req.gen.tools == [{"type": "function", "function": {
        "name": "get", "parameters": TOOL["input_schema"], "description": "d"}}]
    assert req.gen.strict_tools == ["get"]
    assert req.ignored == ("tools[].type=web_search_20250305", "tools[].type=bash_20250124")
    # Deferred to a tool search exod does not run (Claude Code defers some): left out.
    deferred = claude_req(tools=[TOOL, {**TOOL, "name": "later", "defer_loading": True}])
    assert [t["function"]["name"] for t in deferred.gen.tools] == ["get"]
    assert deferred.ignored == ("tools[].defer_loading",)
    assert says(claude, tools=[{**TOOL, "input_examples": [{}]}]) == "tools[0].input_examples"
    assert says(claude, tools=[{"name": "get"}]) == "tools[0].input_schema"
    # A hosted tool is never a 400, even when fields are strict: clients attach them.
    strict = parse_claude({"model": "m", "max_tokens": 8, "messages": HI, "tools": [
        {"type": "web_fetch_20250910", "name": "web_fetch"}]}, strict=True)[0]
    assert strict.ignored == ("tools[].type=web_fetch_20250910",)


@pytest.mark.parametrize("choice, chat", [
    ({"type": "auto"}, ("auto", None)), ({"type": "any"}, ("required", None)),
    ({"type": "none"}, ("none", None)), ({"type": "tool", "name": "get"}, ("function", "get"))])
def test_tool_choice_maps_onto_the_request_s(choice: dict[str, Any], chat: Any) -> None:
    g = claude(tools=[TOOL], tool_choice=choice)
    assert (g.tool_choice, g.tool_name) == chat


def test_disable_parallel_tool_use_and_tool_choice_keys() -> None:
    assert claude(tools=[TOOL], tool_choice={"type": "any", "disable_parallel_tool_use": True}
                  ).parallel_tool_calls is False
    assert says(claude, tool_choice={"type": "maybe"}) == "tool_choice.type"
    assert says(claude, tools=[TOOL], tool_choice={"type": "tool", "name": "nope"}) == \
        "tool_choice.name"


@pytest.mark.parametrize("body, thinks", [
    ({"thinking": {"type": "enabled", "budget_tokens": 4}}, True),
    ({"thinking": {"type": "adaptive"}}, True),
    ({"thinking": {"type": "disabled"}}, False),
    ({"output_config": {"effort": "low"}}, False),
    ({"output_config": {"effort": "high"}}, True),
    ({"thinking": {"type": "disabled"}, "output_config": {"effort": "max"}}, False),
    ({"thinking": {"type": "enabled", "budget_tokens": 4, "display": "summarized"}}, True),
    ({"thinking": {"type": "adaptive", "display": "omitted"}}, True),
    ({}, None),
])
def test_thinking_and_effort_are_the_template_s_switch(body: dict[str, Any],
                                                       thinks: bool | None) -> None:
    g = claude(**body)
    assert g.chat_template_kwargs == ({} if thinks is None else {"enable_thinking": thinks})
    # Only `enabled` carries a budget, which the runner enforces.
    assert g.think_budget == (4 if body.get("thinking", {}).get("type") == "enabled" else None)


def test_display_omitted_is_what_the_answer_needs() -> None:
    _, view = parse_claude({"model": "m", "max_tokens": 8, "messages": HI,
                            "thinking": {"type": "adaptive", "display": "omitted"}})
    assert view.omit_thinking


@pytest.mark.parametrize("thinking, param", [
    ({"type": "enabled"}, "thinking.budget_tokens"),
    ({"type": "enabled", "budget_tokens": 0}, "thinking.budget_tokens"),
    ({"type": "enabled", "budget_tokens": 8}, "thinking.budget_tokens"),  # not below max_tokens
    ({"type": "enabled", "budget_tokens": 4, "display": "sometimes"}, "thinking.display"),
    ({"type": "disabled", "budget_tokens": 4}, "thinking.budget_tokens"),
    ({"type": "sometimes"}, "thinking.type"),
])
def test_thinking_is_checked_as_anthropic_checks_it(thinking: dict[str, Any],
                                                    param: str) -> None:
    assert says(claude, thinking=thinking) == param


def test_output_config_format_is_a_strict_json_schema() -> None:
    schema = {"type": "object"}
    g = claude(output_config={"format": {"type": "json_schema", "schema": schema}})
    assert g.response_format == {"type": "json_schema", "schema": schema, "strict": True}
    assert claude_req(output_config={"format": {"type": "json_schema", "schema": schema,
                                                "name": "x"}}).ignored == \
        ("output_config.format.name",)
    assert says(claude, output_config={"task_budget": 3}) == "output_config.task_budget"
    assert says(claude, output_config={"effort": "extreme"}) == "output_config.effort"
    assert says(claude, output_config={"effort": ["low"]}) == "output_config.effort"
    assert says(claude, output_config={"format": {"type": "json_schema", "schema": 3}}) == \
        "output_config.format.schema"


def test_every_key_of_an_edit_s_amounts_is_read_and_an_unknown_one_reported() -> None:
    """The objects inside an edit (`trigger`, `keep`, `clear_at_least`) are read against the
    table as every other object is: an unknown key in one is reported, not silently taken; an
    amount must give its `value` (Anthropic's require it: a trigger without one had become
    0, clearing on every turn); an item that is no object is named in English."""
    tool = "clear_tool_uses_20250919"
    req = claude_req(context_management={"edits": [
        {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1,
                                                     "soon": 1}},
        {"type": tool, "trigger": {"type": "tool_uses", "value": 2, "unit": "x"},
         "keep": {"type": "tool_uses", "value": 1, "why": 1},
         "clear_at_least": {"type": "input_tokens", "value": 0, "hint": 1}}]})
    assert req.ignored == ("context_management.edits[].keep.soon",
                           "context_management.edits[].keep.why",
                           "context_management.edits[].trigger.unit",
                           "context_management.edits[].clear_at_least.hint")
    for key in ("trigger", "keep", "clear_at_least"):
        unit = {"trigger": "tool_uses", "keep": "tool_uses"}.get(key, "input_tokens")
        assert says(claude, context_management={"edits": [
            {"type": tool, key: {"type": unit}}]}) == f"context_management.edits[0].{key}.value"
    e = refused(claude, context_management={"edits": [7]})
    assert e.message == "`context_management.edits[0]` must be an edit"
    assert refused(resp, input=[7]).message == "`input[0]` must be an item"


def test_context_management_edits_reach_the_runner_in_their_plain_form() -> None:
    g = claude(context_management={"edits": [
        {"type": "clear_thinking_20251015", "keep": "all"},
        {"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 5},
         "exclude_tools": ["Read"], "clear_tool_inputs": True}]})
    assert g.context_edits == [
        {"type": "clear_thinking_20251015", "keep": -1},
        {"type": "clear_tool_uses_20250919", "trigger": ["tool_uses", 5], "keep": 3,
         "clear_at_least": 0, "exclude_tools": ["Read"], "clear_tool_inputs": True}]
    assert says(claude, context_management={"edits": [{"type": "compact_20260112"}]}) == \
        "context_management.edits[0].type"
    assert says(claude, context_management={"edits": [
        {"type": "clear_tool_uses_20250919", "keep": {"type": "tool_uses", "value": -1}}]}) \
        == "context_management.edits[0].keep.value"
    assert claude_req(context_management={"edits": [{"type": "clear_everything_2030"}]}
                      ).ignored == ("context_management.edits[].type=clear_everything_2030",)


# ---- the runner's errors name what the client sent ---------------------------------------------
def test_the_runner_names_the_dialect_s_fields() -> None:
    g = claude(tools=[{"type": "web_search_20250305", "name": "w"}, TOOL],
               output_config={"format": {"type": "json_schema", "schema": {}}})
    assert g.named("tools[0].function.parameters") == "tools[1].input_schema"
    assert g.named("response_format.json_schema.schema") == "output_config.format.schema"
    assert g.named("messages") == "messages"


def test_anthropic_error_shape_and_statuses() -> None:
    assert anthropic.error_body(bad_request("no")) == {
        "type": "error", "error": {"type": "invalid_request_error", "message": "no"}}
    full = queue_full("m", 1, 0)
    assert anthropic.error_status(full) == 429 and full.headers["Retry-After"] == "1"
    assert anthropic.error_body(full)["error"]["type"] == "rate_limit_error"
    busy = not_ready("m", "loading")
    assert anthropic.error_status(busy) == 529
    assert anthropic.error_body(busy)["error"]["type"] == "overloaded_error"


# ---- Anthropic Messages answers -----------------------------------------------------------------
def chat_object(content: str | None = "hi", finish: m.FinishReason = "stop",
                reasoning_content: str = "", tool_calls: tuple[Call, ...] = (),
                **done: Any) -> Reply:
    """A whole answer, as the core hands it to every dialect."""
    end = m.Done("r", finish, 5, 2, cached_tokens=3, **done)
    return Reply(content or "", Finished.of(end), reasoning_content, tool_calls)


def test_a_whole_message_has_thinking_text_and_tool_use_blocks_in_order() -> None:
    call = Call("c", "get", '{"a":1}')
    obj = chat_object("ok", "tool_calls", reasoning_content="hmm", tool_calls=(call,))
    msg = AnthropicOutput("m").whole(obj)
    assert msg["content"] == [{"type": "thinking", "thinking": "hmm", "signature": ""},
                              {"type": "text", "text": "ok"},
                              {"type": "tool_use", "id": "c", "name": "get", "input": {"a": 1}}]
    assert msg["stop_reason"] == "tool_use"
    assert msg["usage"] == {"input_tokens": 2, "output_tokens": 2, "cache_read_input_tokens": 3,
                            "cache_creation_input_tokens": 0}


def test_a_matched_stop_sequence_is_named() -> None:
    out = AnthropicOutput("m")
    msg = out.whole(chat_object(stop_sequence="END"))
    assert (msg["stop_reason"], msg["stop_sequence"]) == ("stop_sequence", "END")
    assert AnthropicOutput("m").whole(chat_object(finish="length"))["stop_reason"] == \
        "max_tokens"


def test_one_table_words_every_stop_in_every_dialect() -> None:
    """The runner's finish reason and stop sequence become one stop, which each dialect words
    from the one table (exod.api.stop_reasons)."""
    def stop(finish: m.FinishReason, sequence: str | None = None) -> StopReason:
        return StopReason.of(m.Done("r", finish, 1, 1, stop_sequence=sequence))
    assert [stop("stop"), stop("stop", "END"), stop("length"), stop("tool_calls")] == [
        StopReason.END, StopReason.STOP_SEQUENCE, StopReason.LENGTH, StopReason.TOOL_CALLS]
    words = {s: (w.openai, w.anthropic, w.responses, w.incomplete, w.ollama)
             for s, w in STOP_REASONS.items()}
    assert words == {
        StopReason.END: ("stop", "end_turn", "completed", None, "stop"),
        StopReason.STOP_SEQUENCE: ("stop", "stop_sequence", "completed", None, "stop"),
        StopReason.LENGTH: ("length", "max_tokens", "incomplete", "max_output_tokens", "length"),
        StopReason.TOOL_CALLS: ("tool_calls", "tool_use", "completed", None, "stop")}


def events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in raw.decode().split("\n\n")[:-1]:
        name, data = block.split("\n")
        payload = json.loads(data.removeprefix("data: "))
        assert name.removeprefix("event: ") == payload["type"]
        out.append((payload["type"], payload))
    return out


def finished(prompt: int, completion: int, stop: StopReason = StopReason.END) -> Finished:
    return Finished(stop, Usage(prompt, completion))


def test_a_stream_has_anthropic_s_events_in_order_and_thinking_ends_signed() -> None:
    out = AnthropicOutput("m")
    args = '{"a": "' + "x" * 64 + '"}'  # streamed in two pieces
    raw = out.begin() + out.delta(Piece("", "a")) + out.delta(Piece("", "b")) + out.delta(
        Piece("c")) + out.delta(Called(0, Call("t", "get", args))) + \
        out.delta(finished(4, 5, StopReason.TOOL_CALLS)) + out.end()
    seen = [(n, d.get("delta", {}).get("type") or d.get("content_block", {}).get("type"))
            for n, d in events(raw)]
    assert seen == [
        ("message_start", None), ("ping", None),
        ("content_block_start", "thinking"), ("content_block_delta", "thinking_delta"),
        ("content_block_delta", "thinking_delta"), ("content_block_delta", "signature_delta"),
        ("content_block_stop", None),
        ("content_block_start", "text"), ("content_block_delta", "text_delta"),
        ("content_block_stop", None),
        ("content_block_start", "tool_use"), ("content_block_delta", "input_json_delta"),
        ("content_block_delta", "input_json_delta"), ("content_block_stop", None),
        ("message_delta", None), ("message_stop", None)]
    last = events(raw)[-2][1]
    assert last["delta"]["stop_reason"] == "tool_use" and last["usage"]["output_tokens"] == 5


def test_an_error_mid_stream_closes_the_block_and_ends_the_stream() -> None:
    out = AnthropicOutput("m")
    raw = out.begin() + out.delta(Piece("a")) + out.failed(
        ApiError(503, "gone", "service_unavailable_error", "aborted")) + out.end()
    names = [n for n, _ in events(raw)]
    assert names[-2:] == ["content_block_stop", "error"]
    assert events(raw)[-1][1]["error"] == {"type": "overloaded_error", "message": "gone"}


def test_thinking_is_signed_and_omitted_when_asked_whole_and_streamed() -> None:
    """A thinking block's signature seals its text; with `display: omitted` the text is
    empty (streamed: no thinking_delta), and the signature still gives it back."""
    omit = anthropic.AnthropicView(omit_thinking=True)
    whole = AnthropicOutput("m", omit, SEALER).whole(chat_object("ok", reasoning_content="hm"))
    block = whole["content"][0]
    assert block["thinking"] == "" and SEALER.open(block["signature"]) == "hm"
    shown = AnthropicOutput("m", sealer=SEALER).whole(chat_object("ok", reasoning_content="hm"))
    assert shown["content"][0]["thinking"] == "hm"
    out = AnthropicOutput("m", omit, SEALER)
    raw = out.begin() + out.delta(Piece("", "a")) + out.delta(Piece("", "b")) + out.delta(
        Piece("c")) + out.delta(finished(1, 3)) + out.end()
    deltas = [d["delta"] for n, d in events(raw) if n == "content_block_delta"]
    assert [d["type"] for d in deltas] == ["signature_delta", "text_delta"]
    assert SEALER.open(deltas[0]["signature"]) == "ab"


def test_applied_context_edits_are_reported_whole_streamed_and_counted() -> None:
    applied = [{"type": "clear_thinking_20251015", "cleared_thinking_turns": 2,
                "cleared_input_tokens": 7}]
    done = m.Done(id="r", finish_reason="stop", prompt_tokens=5, completion_tokens=2,
                  applied_edits=applied)
    out = AnthropicOutput("m", anthropic.AnthropicView(edits=True))
    assert out.whole(chat_object(applied_edits=applied))["context_management"] == {
        "applied_edits": applied}
    assert "context_management" not in AnthropicOutput("m").whole(chat_object())
    stream = AnthropicOutput("m", anthropic.AnthropicView(edits=True))
    raw = stream.begin() + stream.delta(Piece("a")) + stream.delta(Finished.of(done))
    (msg_delta,) = [d for n, d in events(raw) if n == "message_delta"]
    assert msg_delta["context_management"] == {"applied_edits": applied}
    count = CountOutput()
    assert count.whole(Reply("", Finished.of(done))) == {
        "input_tokens": 5, "context_management": {"original_input_tokens": 12}}


# ---- OpenAI Responses requests ------------------------------------------------------------------
def parse_resp(body: dict[str, Any], **kw: Any) -> tuple[GenRequest, responses.ResponsesView]:
    return responses.parse(body, SEALER, **kw)


def resp_req(**body: Any) -> GenRequest:
    return parse_resp({"model": "m", "input": "hi", **body})[0]


def resp(**body: Any) -> Generate:
    return resp_req(**body).gen


@pytest.mark.parametrize("body, param", [
    ({"store": True}, "store"), ({"previous_response_id": "r"}, "previous_response_id"),
    ({"conversation": "c"}, "conversation"), ({"background": True}, "background"),
    ({"truncation": "auto"}, "truncation"),
    ({"include": ["message.output_text.logprobs"]}, "include[0]"),
    ({"prompt": {"id": "p"}}, "prompt"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
    ({"text": {"verbosity": "low"}}, "text.verbosity"),
    ({"reasoning": {"effort": "huge"}}, "reasoning.effort"),
    # wrong types a dict lookup could not hash, and values exod would take and ignore
    ({"reasoning": {"effort": ["high"]}}, "reasoning.effort"),
    ({"reasoning": {"summary": "frob"}}, "reasoning.summary"),
    ({"reasoning": {"generate_summary": {}}}, "reasoning.generate_summary"),
    ({"input": [{"type": ["message"], "role": "user", "content": "x"}]}, "input[0].type"),
    ({"text": {"format": {"type": "json_object", "schema": {}}}}, "text.format.schema"),
    ({"text": {"format": {"type": "text", "name": "o"}}}, "text.format.name"),
])
def test_responses_refuses_what_a_stateless_text_server_cannot_do(body: dict[str, Any],
                                                                  param: str) -> None:
    assert says(resp, **body) == param


@pytest.mark.parametrize("body, ignored", [
    ({"tools": [{"type": "web_search", "external_web_access": True}]},
     ("tools[].type=web_search",)),
    ({"tools": [{"type": "code_interpreter", "container": {"type": "auto"}}]},
     ("tools[].type=code_interpreter",)),
    ({"reasoning": {"budget": 3}}, ("reasoning.budget",)),
    ({"client_metadata": {"session_id": "s"}, "prompt_cache_key": "k", "store": False}, ()),
    ({"include": ["web_search_call.action.sources", "reasoning.encrypted_content"]}, ()),
    ({"input": [{"type": "web_search_call", "id": "ws", "status": "completed",
                 "action": {"type": "search", "query": "q"}}, *HI]},
     ("input[].type=web_search_call",)),
])
def test_responses_accepts_what_cannot_change_the_answer_and_reports_the_rest(
        body: dict[str, Any], ignored: tuple[str, ...]) -> None:
    assert resp_req(**body).ignored == ignored


def test_responses_fields_map_onto_the_request() -> None:
    req = resp_req(instructions="be", max_output_tokens=3, temperature=0, top_p=1,
                   parallel_tool_calls=False, stream=True, store=False, metadata={"a": "b"},
                   include=["reasoning.encrypted_content"], truncation="disabled")
    g = req.gen
    assert g.messages == [{"role": "system", "content": "be"}, {"role": "user", "content": "hi"}]
    assert (g.max_tokens, g.temperature, g.top_p, g.parallel_tool_calls) == (3, 0.0, 1.0, False)
    assert req.stream and req.include_usage and req.ignored == ()
    assert g.named("max_tokens") == "max_output_tokens" and g.named("messages") == "input"


def test_input_items_carry_the_conversation_calls_and_reasoning() -> None:
    items = [{"role": "user", "content": [{"type": "input_text", "text": "q"}]},
             {"type": "reasoning", "id": "rs_1", "summary": [], "status": "completed",
              "content": [{"type": "reasoning_text", "text": "think"}],
              "encrypted_content": None},
             {"type": "function_call", "id": "fc_1", "status": "completed", "call_id": "c",
              "name": "get", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c", "output": "r", "name": "get"},
             {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
              "content": [{"type": "output_text", "text": "a", "annotations": [],
                           "logprobs": []}]}]
    assert resp(input=items).messages == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "reasoning_content": "think", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "get", "arguments": {}}}]},
        {"role": "tool", "tool_call_id": "c", "content": "r", "name": "get"},
        {"role": "assistant", "content": "a"}]


def test_a_reasoning_item_s_summary_stands_in_for_missing_content() -> None:
    items = [*HI, {"type": "reasoning", "id": "rs", "summary": [
        {"type": "summary_text", "text": "sum"}]}, {"role": "assistant", "content": "a"}]
    assert resp(input=items).messages[1]["reasoning_content"] == "sum"
    bad = [{"type": "reasoning", "id": "rs", "summary": [{"type": "image"}]}]
    assert says(resp, input=bad) == "input[0].summary[0]"


def test_encrypted_content_round_trips_and_a_foreign_one_is_reported() -> None:
    """Codex sends reasoning items back with `encrypted_content` and no `content`: exod's own
    gives the reasoning back to the prompt; another server's is ignored, not a 400."""
    def turn(sealed: str) -> list[Any]:
        return [*HI, {"type": "reasoning", "id": "rs", "summary": [],
                      "encrypted_content": sealed}, {"role": "assistant", "content": "a"}]
    assert resp(input=turn(SEALER.seal("deep"))).messages[1]["reasoning_content"] == "deep"
    foreign = resp_req(input=turn("gAAAAABo-opaque"))
    assert "reasoning_content" not in foreign.gen.messages[1]
    assert foreign.ignored == ("input[].encrypted_content",)
    tampered = SEALER.seal("deep")[:-4] + "AAAA"
    assert resp_req(input=turn(tampered)).ignored == ("input[].encrypted_content",)


def test_the_seals_of_one_request_open_to_no_more_than_a_body_could_hold() -> None:
    """A seal is small where its text repeats: zlib gives back a thousand times its size, and
    the seal of a model's looping reasoning (32k tokens of one word: 200 bytes) replayed 20,000
    times in one 4 MiB body opened to gigabytes in the daemon. The seals of one request
    together give back at most what the body could have held as text (api.max_body_kib):
    past it, a 400 names the seal that went over."""
    sealer = Sealer(key=b"k" * 32, most=1000)
    loop = sealer.seal("why " * 200)  # 800 bytes of text, a seal of a few dozen
    assert len(loop) < 80
    def claude_turns(n: int) -> dict[str, Any]:
        turns: list[Any] = []
        for _ in range(n):
            turns += [*HI, {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "", "signature": loop},
                {"type": "text", "text": "a"}]}]
        return {"model": "m", "max_tokens": 8, "messages": [*turns, *HI]}
    req, _ = anthropic.parse(claude_turns(1), sealer)
    assert req.gen.messages[1]["reasoning_content"] == "why " * 200
    e = refused(anthropic.parse, claude_turns(2), sealer)
    assert e.param == "messages[3].content[0].signature"
    def codex_turns(n: int) -> dict[str, Any]:
        items: list[Any] = []
        for _ in range(n):
            items += [*HI, {"type": "reasoning", "summary": [], "encrypted_content": loop},
                      {"role": "assistant", "content": "a"}]
        return {"model": "m", "input": items}
    assert responses.parse(codex_turns(1), sealer)[0].gen.messages[1]["reasoning_content"]
    assert refused(responses.parse, codex_turns(2), sealer).param == \
        "input[4].encrypted_content"
    assert refused(anthropic.parse, claude_turns(1), Sealer(key=b"k" * 32, most=500)).param \
        == "messages[1].content[0].signature"  # one seal alone over the bound, too


@pytest.mark.parametrize("item, outcome", [
    ({"role": "user", "content": "q", "colour": "red"}, ("input[].colour",)),
    ({"role": "user", "content": [{"type": "input_file", "file_id": "f"}]},
     "input[0].content[0].type"),
    ({"role": "assistant", "content": [{"type": "output_text", "text": "a", "annotations": [
        {"type": "url_citation"}]}]}, "input[0].content[0].annotations"),
    ({"type": "function_call_output", "call_id": "c", "output": "r",
      "caller": {"type": "program", "caller_id": "p"}}, "input[0].caller"),
])
def test_an_input_item_key_works_is_harmless_ignored_or_refused(item: dict[str, Any],
                                                                outcome: Any) -> None:
    if isinstance(outcome, str):
        assert says(resp, input=[item]) == outcome
    else:
        assert resp_req(input=[item]).ignored == outcome


def test_namespace_tools_serve_their_functions_under_codex_s_flat_name() -> None:
    """Codex's `namespace` tools: each function is offered as NAMESPACE__NAME; a call sent
    back with `namespace` reaches the template under the same name."""
    ns = {"type": "namespace", "name": "collaboration", "description": "agents", "tools": [
        {"type": "function", "name": "spawn_agent", "parameters": {"type": "object"}},
        {"type": "function", "name": "_send", "strict": True, "parameters": {"type": "object"}}]}
    req, view = parse_resp({"model": "m", "input": [*HI, {
        "type": "function_call", "call_id": "c", "name": "spawn_agent",
        "namespace": "collaboration", "arguments": "{}"}], "tools": [ns]})
    assert [t["function"]["name"] for t in req.gen.tools] == ["collaboration__spawn_agent",
                                                               "collaboration__send"]
    assert req.gen.strict_tools == ["collaboration__send"]
    assert view.namespaces == {"collaboration__spawn_agent": ("collaboration", "spawn_agent"),
                               "collaboration__send": ("collaboration", "_send")}
    assert req.gen.messages[1]["tool_calls"][0]["function"]["name"] == \
        "collaboration__spawn_agent"
    assert req.gen.named("tools[1].function.parameters") == "tools[0].tools[1].parameters"
    assert says(resp, tools=[{**ns, "name": "a b"}]) == "tools[0].name"
    forced = resp(tools=[ns], tool_choice={"type": "function", "name": "spawn_agent",
                                           "namespace": "collaboration"})
    assert forced.tool_name == "collaboration__spawn_agent"
    # An MCP server's long name before a tool's: each part within 64, the two together not.
    server = "mcp__" + "s" * 55
    long_ns = {**ns, "name": server, "tools": [{"type": "function", "name": "read_" + "f" * 40}]}
    _, long_view = parse_resp({"model": "m", "input": HI, "tools": [long_ns]})
    assert long_view.namespaces == {f"{server}__read_{'f' * 40}": (server, "read_" + "f" * 40)}
    assert says(resp, tools=[{**ns, "tools": [{"type": "function", "name": "x" * 65}]}]) == \
        "tools[0].tools[0].name"


def test_responses_tools_tool_choice_and_text_format() -> None:
    tool = {"type": "function", "name": "get", "parameters": {"type": "object"},
            "strict": None, "defer_loading": False}
    g = resp(tools=[tool], tool_choice={"type": "function", "name": "get"})
    assert g.tools == [{"type": "function", "function": {
        "name": "get", "parameters": {"type": "object"}}}]
    assert (g.tool_choice, g.tool_name) == ("function", "get")
    fmt = {"format": {"type": "json_schema", "name": "o", "schema": {}}}
    assert resp(text=fmt).response_format == {"type": "json_schema", "schema": {},
                                              "strict": False}
    assert says(resp, text=fmt, tools=[tool], tool_choice="required") == "text.format"
    assert resp_req(tools=[{**tool, "output_schema": {}}]).ignored == ("tools[].output_schema",)
    assert resp_req(tool_choice={"type": "function", "name": "get", "x": 1},
                    tools=[tool]).ignored == ("tool_choice.x",)
    assert says(resp, tools=[tool], tool_choice={"type": "function", "name": "nope"}) == \
        "tool_choice.name"


@pytest.mark.parametrize("field, value", [
    ("metadata", {"a": "\ud800"}), ("metadata", {"a": float("nan")}),
    ("tools", [{"type": "web_search", "filters": {"q": "\udfff"}}]),
    ("tools", [{"type": "web_search", "size": float("inf")}]),
    ("text", {"format": {"type": "text"}, "colour": "\ud800"}),
    ("reasoning", {"effort": "low", "weight": float("-inf")}),
    ("tool_choice", {"type": "function", "name": "get", "why": "\ud800"}),
])
def test_what_a_response_repeats_of_the_request_must_be_json_it_can_write(
        field: str, value: Any) -> None:
    """The response object repeats `metadata`, `tools`, `tool_choice`, `text` and `reasoning`
    as sent: a lone surrogate (no UTF-8 can carry it) broke the stream after its head was sent,
    and NaN made the answer no JSON at all. Refused by name instead, before anything is sent."""
    tools = [{"type": "function", "name": "get", "parameters": {}}]
    assert says(resp, **{"tools": tools, field: value}) == field
    body = {"model": "m", "input": "hi", "tools": tools,
            "metadata": {"a": "\u00e9 \U0001f600"}, "reasoning": {"effort": "low", "x": 1.5}}
    parse_resp(body)  # plain text and finite numbers pass, and are written back as they came
    head = ResponsesOutput("m", body).begin()
    assert json.loads(head.split(b"data: ")[1].split(b"\n")[0])["response"]["metadata"] == \
        body["metadata"]


@pytest.mark.parametrize("effort, thinks", [("none", False), ("minimal", False), ("low", True),
                                            ("high", True)])
def test_reasoning_effort_is_the_template_s_switch(effort: str, thinks: bool) -> None:
    assert resp(reasoning={"effort": effort, "summary": "auto"}).chat_template_kwargs == \
        {"enable_thinking": thinks}


@pytest.mark.parametrize("body, param", [
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"tools": [{"type": "function", "name": "a b", "parameters": {}}]}, "tools[0].name"),
    ({"instructions": "i", "input": [{"type": "function_call", "call_id": "c", "name": "g",
                                      "arguments": "[1]"}]}, "input[0].arguments"),
])
def test_responses_errors_name_openai_responses_fields(body: dict[str, Any],
                                                       param: str) -> None:
    e = refused(resp, **body)
    assert e.param == param and f"`{param}`" in e.message, e.message


# ---- OpenAI Responses answers -------------------------------------------------------------------
def test_a_whole_response_holds_reasoning_message_and_calls_in_order() -> None:
    call = Call("c", "get", "{}")
    r = ResponsesOutput("m", {}).whole(chat_object("ok", "length", reasoning_content="hmm",
                                                   tool_calls=(call,)))
    assert [i["type"] for i in r["output"]] == ["reasoning", "message", "function_call"]
    assert [i["id"][:3] for i in r["output"]] == ["rs_", "msg", "fc_"]
    assert r["status"] == "incomplete"
    assert r["incomplete_details"] == {"reason": "max_output_tokens"}
    assert r["usage"]["input_tokens_details"] == {"cached_tokens": 3}


def test_a_namespaced_call_comes_back_with_its_namespace_and_reasoning_sealed() -> None:
    view = responses.ResponsesView({"ns__go": ("ns", "go")}, encrypted=True)
    call = Call("c", "ns__go", "{}")
    r = ResponsesOutput("m", {}, view, SEALER).whole(chat_object(
        None, "tool_calls", reasoning_content="why", tool_calls=(call,)))
    reasoning, fc = r["output"]
    assert (fc["name"], fc["namespace"], fc["call_id"]) == ("go", "ns", "c")
    assert SEALER.open(reasoning["encrypted_content"]) == "why"
    plain = ResponsesOutput("m", {}).whole(chat_object(None, "tool_calls",
                                                       reasoning_content="why",
                                                       tool_calls=(call,)))
    assert "encrypted_content" not in plain["output"][0]
    assert "namespace" not in plain["output"][1] and plain["output"][1]["name"] == "ns__go"
    out = ResponsesOutput("m", {}, view, SEALER)
    raw = out.begin() + out.delta(Called(0, call)) + out.delta(finished(1, 2))
    added = [e for e in sse_types(raw) if e["type"] == "response.output_item.added"]
    assert (added[0]["item"]["name"], added[0]["item"]["namespace"]) == ("go", "ns")


def sse_types(raw: bytes) -> list[dict[str, Any]]:
    return [d for _, d in events(raw)]


def test_a_reasoning_item_streams_with_its_part_and_events_are_numbered() -> None:
    out = ResponsesOutput("m", {})
    raw = out.begin() + out.delta(Piece("", "a")) + out.delta(Piece("b")) + out.delta(
        finished(1, 2))
    evs = sse_types(raw)
    assert [e["type"] for e in evs] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
        "response.reasoning_text.delta", "response.reasoning_text.done",
        "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]
    assert [e["sequence_number"] for e in evs] == list(range(len(evs)))
    assert evs[3]["part"] == {"type": "reasoning_text", "text": ""}
    assert evs[6]["part"] == {"type": "reasoning_text", "text": "a"}


def test_a_failure_mid_stream_is_error_then_response_failed() -> None:
    out = ResponsesOutput("m", {})
    raw = out.begin() + out.delta(Piece("a")) + out.failed(
        ApiError(503, "gone", "service_unavailable_error", "aborted")) + out.end()
    *_, error, failed = sse_types(raw)
    assert error["type"] == "error" and (error["code"], error["message"]) == ("aborted", "gone")
    assert failed["type"] == "response.failed"
    assert failed["response"]["status"] == "failed"
    assert failed["response"]["error"] == {"code": "server_error", "message": "gone"}
    assert [i["type"] for i in failed["response"]["output"]] == ["message"]
