"""The dialect adapters' pure translation (exod.api.dialects), a rule per test: Anthropic
Messages and OpenAI Responses requests into chat completions bodies, the core's objects and
chunks back into each dialect's answers and events, and the core's errors in each dialect's
field names. No processes, no sockets (test_dialects drives them end to end)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from exod import messages as m
from exod.api.dialects import anthropic_request as anthropic
from exod.api.dialects import keys
from exod.api.dialects import responses_request as responses
from exod.api.dialects.anthropic_output import AnthropicOutput
from exod.api.dialects.names import Origin
from exod.api.dialects.responses_output import ResponsesOutput
from exod.api.errors import ApiError, bad_request, not_ready, queue_full
from exod.api.schema import parse_chat

HI: list[Any] = [{"role": "user", "content": "hi"}]
TOOL: dict[str, Any] = {"name": "get", "description": "d",
                        "input_schema": {"type": "object", "properties": {}}}


def claude(**body: Any) -> dict[str, Any]:
    return anthropic.to_chat({"model": "m", "max_tokens": 8, "messages": HI, **body})


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
def test_messages_top_level_fields_work_have_no_effect_or_are_refused() -> None:
    assert claude(metadata={"user_id": "u"}, service_tier="auto",
                  cache_control={"type": "ephemeral"}) == claude()
    assert says(claude, container="c") == "container"
    assert says(anthropic.to_chat, {"model": "m", "messages": HI}) == "max_tokens"
    assert says(claude, max_tokens=0) == "max_tokens"
    assert says(claude, messages=[]) == "messages"
    assert says(anthropic.to_chat, {"model": "m", "max_tokens": 3, "messages": HI},
                count_only=True) == "max_tokens"
    refused(anthropic.to_chat, [])


def test_messages_sampling_stop_and_stream_fields_map_onto_chat() -> None:
    chat = claude(stop_sequences=["x"], temperature=0, top_p=0.5, top_k=3, stream=True)
    assert chat == {"model": "m", "messages": HI, "max_tokens": 8, "stop": ["x"],
                    "temperature": 0, "top_p": 0.5, "top_k": 3, "stream": True,
                    "stream_options": {"include_usage": True}}


def test_system_as_a_string_or_text_blocks_comes_first() -> None:
    assert claude(system="s")["messages"][0] == {"role": "system", "content": "s"}
    blocks = [{"type": "text", "text": "a"}, {"type": "text", "text": "b",
                                              "cache_control": {"type": "ephemeral"}}]
    assert claude(system=blocks)["messages"][0] == {"role": "system", "content": "a\n\nb"}
    assert says(claude, system=[{"type": "image"}]) == "system[0]"
    assert says(claude, system=[{"type": "text", "text": "a", "x": 1}]) == "system[0].x"


def test_a_user_turn_s_tool_results_become_tool_messages_before_its_text() -> None:
    chat = claude(messages=user({"type": "text", "text": "and"},
                                {"type": "tool_result", "tool_use_id": "t", "content": "r"},
                                {"type": "tool_result", "tool_use_id": "u", "is_error": True,
                                 "content": [{"type": "text", "text": "bad"}]}))
    assert chat["messages"] == [{"role": "tool", "content": "r", "tool_call_id": "t"},
                                {"role": "tool", "content": "Error: bad", "tool_call_id": "u"},
                                {"role": "user", "content": "and"}]
    assert says(claude, messages=user({"type": "tool_result", "tool_use_id": "t",
                                       "is_error": "yes"})) == "messages[0].content[0].is_error"
    assert says(claude, messages=user({"type": "image", "source": {}})) == \
        "messages[0].content[0].type"


def test_an_assistant_turn_s_blocks_become_its_text_reasoning_and_calls() -> None:
    turn = [{"type": "thinking", "thinking": "hmm", "signature": "s"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "text", "text": "ok"},
            {"type": "tool_use", "id": "t", "name": "get", "input": {"a": 1}}]
    (msg,) = claude(messages=[{"role": "assistant", "content": turn}])["messages"]
    assert msg == {"role": "assistant", "content": "ok", "reasoning_content": "hmm",
                   "tool_calls": [{"id": "t", "type": "function",
                                   "function": {"name": "get", "arguments": '{"a": 1}'}}]}
    bad = [{"type": "tool_use", "id": "t", "name": "get", "input": "x"}]
    assert says(claude, messages=[{"role": "assistant", "content": bad}]) == \
        "messages[0].content[0].input"
    assert says(claude, messages=[{"role": "user", "content": "a", "name": "x"}]) == \
        "messages[0].name"


@pytest.mark.parametrize("block, accepted", [
    ({"type": "text", "text": "a", "cache_control": {"type": "ephemeral", "ttl": "1h"}}, True),
    ({"type": "text", "text": "a", "citations": None}, True),
    ({"type": "text", "text": "a", "citations": []}, True),
    ({"type": "text", "text": "a", "citations": [{"type": "char_location"}]}, False),
    ({"type": "text", "text": "a", "colour": "red"}, False),
    ({"type": "tool_result", "tool_use_id": "t", "content": "r", "toolset_name": None}, True),
    ({"type": "tool_result", "tool_use_id": "t", "content": "r", "toolset_name": "mcp"}, False),
])
def test_a_content_block_key_works_is_harmless_or_is_refused_by_name(
        block: dict[str, Any], accepted: bool) -> None:
    if accepted:
        claude(messages=user(block))
    else:
        key = [k for k in block if k not in ("type", "text", "tool_use_id", "content")][0]
        assert says(claude, messages=user(block)) == f"messages[0].content[0].{key}"


@pytest.mark.parametrize("caller, accepted", [
    (None, True), ({"type": "direct"}, True), ({"type": "code_execution_20250825"}, False)])
def test_a_tool_use_s_caller_is_the_model_itself(caller: Any, accepted: bool) -> None:
    block = {"type": "tool_use", "id": "t", "name": "get", "input": {}, "caller": caller}
    body = [{"role": "assistant", "content": [block]}]
    if accepted:
        claude(messages=body)
    else:
        assert says(claude, messages=body) == "messages[0].content[0].caller"


def test_tools_map_onto_function_tools_and_refuse_what_they_cannot_do() -> None:
    chat = claude(tools=[{**TOOL, "strict": True, "cache_control": {"type": "ephemeral"},
                          "eager_input_streaming": True, "defer_loading": False}])
    assert chat["tools"] == [{"type": "function", "function": {
        "name": "get", "parameters": TOOL["input_schema"], "description": "d", "strict": True}}]
    assert says(claude, tools=[{"type": "web_search_20250305", "name": "w"}]) == "tools[0].type"
    assert says(claude, tools=[{**TOOL, "defer_loading": True}]) == "tools[0].defer_loading"
    assert says(claude, tools=[{**TOOL, "input_examples": [{}]}]) == "tools[0].input_examples"
    assert says(claude, tools=[{"name": "get"}]) == "tools[0].input_schema"


@pytest.mark.parametrize("choice, chat", [
    ({"type": "auto"}, "auto"), ({"type": "any"}, "required"), ({"type": "none"}, "none"),
    ({"type": "tool", "name": "get"}, {"type": "function", "function": {"name": "get"}})])
def test_tool_choice_maps_onto_chat_s(choice: dict[str, Any], chat: Any) -> None:
    assert claude(tools=[TOOL], tool_choice=choice)["tool_choice"] == chat


def test_disable_parallel_tool_use_and_tool_choice_keys() -> None:
    chat = claude(tool_choice={"type": "any", "disable_parallel_tool_use": True})
    assert chat["parallel_tool_calls"] is False
    assert says(claude, tool_choice={"type": "auto", "name": "get"}) == "tool_choice.name"
    assert says(claude, tool_choice={"type": "maybe"}) == "tool_choice"


@pytest.mark.parametrize("body, thinks", [
    ({"thinking": {"type": "enabled", "budget_tokens": 4}}, True),
    ({"thinking": {"type": "adaptive"}}, True),
    ({"thinking": {"type": "disabled"}}, False),
    ({"output_config": {"effort": "low"}}, False),
    ({"output_config": {"effort": "high"}}, True),
    ({"thinking": {"type": "disabled"}, "output_config": {"effort": "max"}}, False),
    ({"thinking": {"type": "enabled", "budget_tokens": 4, "display": "summarized"}}, True),
    ({}, None),
])
def test_thinking_and_effort_are_the_template_s_switch(body: dict[str, Any],
                                                       thinks: bool | None) -> None:
    kwargs = claude(**body).get("chat_template_kwargs")
    assert kwargs == (None if thinks is None else {"enable_thinking": thinks})
    # Only `enabled` carries a budget, which goes to the runner apart from the chat body.
    assert anthropic.think_budget(body) == (
        4 if body.get("thinking", {}).get("type") == "enabled" else None)


@pytest.mark.parametrize("thinking, param", [
    ({"type": "enabled"}, "thinking.budget_tokens"),
    ({"type": "enabled", "budget_tokens": 0}, "thinking.budget_tokens"),
    ({"type": "enabled", "budget_tokens": 8}, "thinking.budget_tokens"),  # not below max_tokens
    ({"type": "enabled", "budget_tokens": 4, "display": "omitted"}, "thinking.display"),
    ({"type": "disabled", "budget_tokens": 4}, "thinking.budget_tokens"),
    ({"type": "sometimes"}, "thinking.type"),
])
def test_thinking_is_checked_as_anthropic_checks_it(thinking: dict[str, Any],
                                                    param: str) -> None:
    assert says(claude, thinking=thinking) == param


def test_output_config_format_is_a_strict_json_schema() -> None:
    schema = {"type": "object"}
    chat = claude(output_config={"format": {"type": "json_schema", "schema": schema}})
    assert chat["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "output", "schema": schema, "strict": True}}
    assert says(claude, output_config={"format": {"type": "json_schema", "schema": schema,
                                                  "name": "x"}}) == "output_config.format.name"
    assert says(claude, output_config={"task_budget": 3}) == "output_config.task_budget"
    assert says(claude, output_config={"effort": "extreme"}) == "output_config.effort"
    assert says(claude, output_config={"effort": ["low"]}) == "output_config.effort"


# ---- the core's errors in the dialect's field names ------------------------------------------
def core_error(module: Any, body: dict[str, Any]) -> ApiError:
    origins: list[Origin] = []
    chat = module.to_chat(body, origins=origins)
    with pytest.raises(ApiError) as e:
        parse_chat(chat)
    return module.renamed(e.value, origins)


@pytest.mark.parametrize("body, param", [
    ({"tools": [{**TOOL, "name": "a b"}]}, "tools[0].name"),
    ({"stop_sequences": ["x" * 5000]}, "stop_sequences"),
    ({"system": "s", "messages": [*HI, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "get", "input": {}}]},
        {"role": "user", "content": "x", }], "tools": [TOOL],
      "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice"),
    ({"temperature": 9}, "temperature"),
])
def test_messages_errors_name_anthropic_s_fields(body: dict[str, Any], param: str) -> None:
    e = core_error(anthropic, {"model": "m", "max_tokens": 8, "messages": HI, **body})
    assert e.param == param and f"`{param}`" in e.message, e.message


def test_a_chat_message_index_becomes_the_turn_it_came_from() -> None:
    from exod.api.dialects.names import dialect_param
    origins: list[Origin] = [("system", False), ("messages[0]", True), ("messages[1]", True),
                             ("input[2].output", False)]
    assert dialect_param("messages[2].content", origins, (), "x") == "messages[1].content"
    assert dialect_param("messages[2].tool_calls[0].function.arguments", origins, (), "x") \
        == "messages[1]"
    assert dialect_param("messages[3].content", origins, (), "x") == "input[2].output"
    assert dialect_param("tools[1].function.parameters.type", origins, (), "input_schema") == \
        "tools[1].input_schema.type"
    assert dialect_param("seed", origins, (), "x") == "seed"


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
def chat_object(content: str | None = "hi", finish: str = "stop", **message: Any
                ) -> dict[str, Any]:
    return {"choices": [{"message": {"role": "assistant", "content": content, **message},
                         "finish_reason": finish}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2,
                      "prompt_tokens_details": {"cached_tokens": 3}}}


def test_a_whole_message_has_thinking_text_and_tool_use_blocks_in_order() -> None:
    call = {"id": "c", "type": "function", "function": {"name": "get", "arguments": '{"a":1}'}}
    obj = chat_object("ok", "tool_calls", reasoning_content="hmm", tool_calls=[call])
    msg = AnthropicOutput("m").whole(obj)
    assert msg["content"] == [{"type": "thinking", "thinking": "hmm", "signature": ""},
                              {"type": "text", "text": "ok"},
                              {"type": "tool_use", "id": "c", "name": "get", "input": {"a": 1}}]
    assert msg["stop_reason"] == "tool_use"
    assert msg["usage"] == {"input_tokens": 5, "output_tokens": 2, "cache_read_input_tokens": 3,
                            "cache_creation_input_tokens": 0}


def test_a_matched_stop_sequence_is_named() -> None:
    out = AnthropicOutput("m")
    out.seen(m.Done(id="r", finish_reason="stop", prompt_tokens=1, completion_tokens=1,
                    stop_sequence="END"))
    msg = out.whole(chat_object())
    assert (msg["stop_reason"], msg["stop_sequence"]) == ("stop_sequence", "END")
    assert AnthropicOutput("m").whole(chat_object(finish="length"))["stop_reason"] == \
        "max_tokens"


def events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in raw.decode().split("\n\n")[:-1]:
        name, data = block.split("\n")
        payload = json.loads(data.removeprefix("data: "))
        assert name.removeprefix("event: ") == payload["type"]
        out.append((payload["type"], payload))
    return out


def delta(**d: Any) -> dict[str, Any]:
    return {"choices": [{"delta": d, "finish_reason": None}]}


def test_a_stream_has_anthropic_s_events_in_order_and_thinking_ends_signed() -> None:
    out = AnthropicOutput("m")
    raw = out.begin() + out.chunk(delta(role="assistant")) + out.chunk(
        delta(reasoning_content="a")) + out.chunk(delta(reasoning_content="b")) + out.chunk(
        delta(content="c")) + out.chunk(delta(tool_calls=[
            {"index": 0, "id": "t", "function": {"name": "get", "arguments": '{"a"'}}])) + \
        out.chunk(delta(tool_calls=[{"index": 0, "function": {"arguments": ":1}"}}])) + \
        out.chunk({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]}) + \
        out.chunk({"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 5}}) + \
        out.end()
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
    raw = out.begin() + out.chunk(delta(content="a")) + out.failed(
        ApiError(503, "gone", "service_unavailable_error", "aborted")) + out.end()
    names = [n for n, _ in events(raw)]
    assert names[-2:] == ["content_block_stop", "error"]
    assert events(raw)[-1][1]["error"] == {"type": "overloaded_error", "message": "gone"}


# ---- OpenAI Responses requests ------------------------------------------------------------------
def resp(**body: Any) -> dict[str, Any]:
    return responses.to_chat({"model": "m", "input": "hi", **body})


@pytest.mark.parametrize("body, param", [
    ({"store": True}, "store"), ({"previous_response_id": "r"}, "previous_response_id"),
    ({"conversation": "c"}, "conversation"), ({"background": True}, "background"),
    ({"truncation": "auto"}, "truncation"), ({"include": ["file_search_call.results"]},
                                              "include[0]"),
    ({"prompt": {"id": "p"}}, "prompt"), ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
    ({"text": {"verbosity": "low"}}, "text.verbosity"),
    ({"reasoning": {"effort": "huge"}}, "reasoning.effort"),
    ({"reasoning": {"budget": 3}}, "reasoning.budget"),
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


def test_responses_fields_map_onto_chat() -> None:
    chat = resp(instructions="be", max_output_tokens=3, temperature=0, top_p=1,
                parallel_tool_calls=False, stream=True, store=False, metadata={"a": "b"},
                include=["reasoning.encrypted_content"], truncation="disabled")
    assert chat == {"model": "m", "messages": [{"role": "system", "content": "be"},
                                               {"role": "user", "content": "hi"}],
                    "max_tokens": 3, "temperature": 0, "top_p": 1, "parallel_tool_calls": False,
                    "stream": True, "stream_options": {"include_usage": True}}


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
    assert resp(input=items)["messages"] == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "reasoning_content": "think", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "get", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "r", "name": "get"},
        {"role": "assistant", "content": "a"}]


def test_a_reasoning_item_s_summary_stands_in_for_missing_content() -> None:
    items = [*HI, {"type": "reasoning", "id": "rs", "summary": [
        {"type": "summary_text", "text": "sum"}]}, {"role": "assistant", "content": "a"}]
    assert resp(input=items)["messages"][1]["reasoning_content"] == "sum"
    bad = [{"type": "reasoning", "id": "rs", "summary": [{"type": "image"}]}]
    assert says(resp, input=bad) == "input[0].summary[0]"


@pytest.mark.parametrize("item, param", [
    ({"role": "user", "content": "q", "colour": "red"}, "input[0].colour"),
    ({"role": "user", "content": [{"type": "input_image", "image_url": "u"}]},
     "input[0].content[0]"),
    ({"role": "assistant", "content": [{"type": "output_text", "text": "a", "annotations": [
        {"type": "url_citation"}]}]}, "input[0].content[0].annotations"),
    ({"type": "function_call", "call_id": "c", "name": "g", "arguments": "{}",
      "namespace": "ns"}, "input[0].namespace"),
    ({"type": "function_call_output", "call_id": "c", "output": "r",
      "caller": {"type": "program", "caller_id": "p"}}, "input[0].caller"),
])
def test_an_input_item_key_works_is_harmless_or_is_refused_by_name(item: dict[str, Any],
                                                                   param: str) -> None:
    assert says(resp, input=[item]) == param


def test_responses_tools_tool_choice_and_text_format() -> None:
    tool = {"type": "function", "name": "get", "parameters": {"type": "object"},
            "strict": None, "defer_loading": False}
    chat = resp(tools=[tool], tool_choice={"type": "function", "name": "get"},
                text={"format": {"type": "json_schema", "name": "o", "schema": {}}})
    assert chat["tools"] == [{"type": "function", "function": {
        "name": "get", "parameters": {"type": "object"}}}]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "get"}}
    assert chat["response_format"] == {"type": "json_schema",
                                       "json_schema": {"name": "o", "schema": {}}}
    assert says(resp, tools=[{**tool, "output_schema": {}}]) == "tools[0].output_schema"
    assert says(resp, tool_choice={"type": "function", "name": "get", "x": 1}) == \
        "tool_choice.x"
    assert says(resp, text={"format": {"type": "json_schema", "schema": {}, "x": 1}}) == \
        "text.format.x"


@pytest.mark.parametrize("effort, thinks", [("none", False), ("minimal", False), ("low", True),
                                            ("high", True)])
def test_reasoning_effort_is_the_template_s_switch(effort: str, thinks: bool) -> None:
    assert resp(reasoning={"effort": effort, "summary": "auto"})["chat_template_kwargs"] == \
        {"enable_thinking": thinks}


@pytest.mark.parametrize("body, param", [
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"tools": [{"type": "function", "name": "a b", "parameters": {}}]}, "tools[0].name"),
    ({"instructions": "i", "input": [{"type": "function_call", "call_id": "c", "name": "g",
                                      "arguments": "[1]"}]}, "input[0]"),
])
def test_responses_errors_name_openai_responses_fields(body: dict[str, Any],
                                                       param: str) -> None:
    e = core_error(responses, {"model": "m", "input": "hi", **body})
    assert e.param == param and f"`{param}`" in e.message, e.message


# ---- OpenAI Responses answers -------------------------------------------------------------------
def test_a_whole_response_holds_reasoning_message_and_calls_in_order() -> None:
    call = {"id": "c", "type": "function", "function": {"name": "get", "arguments": "{}"}}
    r = ResponsesOutput("m", {}).whole(chat_object("ok", "length", reasoning_content="hmm",
                                                   tool_calls=[call]))
    assert [i["type"] for i in r["output"]] == ["reasoning", "message", "function_call"]
    assert [i["id"][:3] for i in r["output"]] == ["rs_", "msg", "fc_"]
    assert r["status"] == "incomplete"
    assert r["incomplete_details"] == {"reason": "max_output_tokens"}
    assert r["usage"]["input_tokens_details"] == {"cached_tokens": 3}


def sse_types(raw: bytes) -> list[dict[str, Any]]:
    return [d for _, d in events(raw)]


def test_a_reasoning_item_streams_with_its_part_and_events_are_numbered() -> None:
    out = ResponsesOutput("m", {})
    raw = out.begin() + out.chunk(delta(reasoning_content="a")) + out.chunk(
        delta(content="b")) + out.chunk({"choices": [{"delta": {}, "finish_reason": "stop"}]}) \
        + out.chunk({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2}})
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
    raw = out.begin() + out.chunk(delta(content="a")) + out.failed(
        ApiError(503, "gone", "service_unavailable_error", "aborted")) + out.end()
    *_, error, failed = sse_types(raw)
    assert error["type"] == "error" and (error["code"], error["message"]) == ("aborted", "gone")
    assert failed["type"] == "response.failed"
    assert failed["response"]["status"] == "failed"
    assert failed["response"]["error"] == {"code": "server_error", "message": "gone"}
    assert [i["type"] for i in failed["response"]["output"]] == ["message"]


# ---- keys ---------------------------------------------------------------------------------------
def test_keys_say_which_values_a_harmless_key_takes() -> None:
    keys.check({"a": 1, "h": None}, "p", ("a",), {"h": keys.empty})
    e = refused(keys.check, {"h": [1]}, "p", (), {"h": keys.empty})
    assert e.param == "p.h" and "only an empty value" in e.message
    assert refused(keys.check, {"z": 1}, "p", ()).param == "p.z"
