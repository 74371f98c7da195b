"""The request rules (exod.core.request_rules), one test per rule: each refuses what it must,
naming the field, and takes what it must. How a rule reaches the client is tested with the API's
parser (test_api_parts, test_security_parts) and on live daemons (integration/test_security)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from exod.core import request_rules as rules
from exod.core.request_rules import RequestError
from exod.wire.messages import Generate, decode_to_runner, to_wire


def refused(fn: Any, *args: Any) -> RequestError:
    with pytest.raises(RequestError) as e:
        fn(*args)
    return e.value


def test_numbers_in_their_range() -> None:
    assert rules.number("temperature", None) == 1.0 and rules.number("top_p", None) == 1.0
    assert rules.number("temperature", 0) == 0.0 and rules.number("temperature", 2) == 2.0
    assert rules.number("top_p", 0.5) == 0.5
    for name, bad in (("temperature", 2.5), ("temperature", -0.1), ("top_p", 1.01),
                      ("top_p", -1), ("temperature", float("inf")), ("top_p", float("nan")),
                      ("temperature", True), ("top_p", "1")):
        e = refused(rules.number, name, bad)
        assert e.param == name and str(e).startswith(f"`{name}` must be a number from 0 to ")


def test_body_is_an_object() -> None:
    assert rules.body({"a": 1}) == {"a": 1}
    for bad in ([], "x", None):
        assert refused(rules.body, bad).param is None


def test_model_names_an_instance() -> None:
    assert rules.model("m") == "m"
    for bad in (None, "", 3):
        assert refused(rules.model, bad).param == "model"


def test_text_refuses_a_lone_surrogate() -> None:
    assert rules.text("héllo ☃", "prompt") == "héllo ☃"
    e = refused(rules.text, "ab\ud800", "stop")
    assert e.param == "stop" and "character 2" in str(e)


def test_seed_is_an_integer() -> None:
    assert rules.seed(None) is None and rules.seed(-3) == -3 and rules.seed(2**70) == 2**70
    for bad in (1.5, True, "3"):
        assert refused(rules.seed, bad).param == "seed"


def test_stream_and_its_options() -> None:
    assert rules.stream(None) is False and rules.stream(True) is True
    assert refused(rules.stream, "yes").param == "stream"
    assert rules.stream_options(None, False) is False
    assert rules.stream_options({"include_usage": True}, True) is True
    assert rules.stream_options({}, True) is False
    for raw, streaming, param in (({"include_usage": True}, False, "stream_options"),
                                  ({"include_usage": 1}, True, "stream_options.include_usage"),
                                  ([], True, "stream_options")):
        assert refused(rules.stream_options, raw, streaming).param == param


def test_stop_sequences() -> None:
    assert rules.stop(None) == [] and rules.stop("\n") == ["\n"]
    assert rules.stop(["a"] * rules.MAX_STOPS) == ["a"] * rules.MAX_STOPS
    assert rules.stop(["x" * rules.MAX_STOP_CHARS]) == ["x" * rules.MAX_STOP_CHARS]
    for bad in (5, ["a"] * (rules.MAX_STOPS + 1), [1], [""], "", "x" * (rules.MAX_STOP_CHARS + 1),
                ["\udc00"]):
        assert refused(rules.stop, bad).param == "stop", bad
    assert refused(rules.stop, [""], "stop_sequences").param == "stop_sequences"


def test_messages_roles_and_content() -> None:
    got = [rules.message(m, f"messages[{i}]") for i, m in enumerate(rules.messages([
        {"role": "developer", "content": [{"type": "text", "text": "a"},
                                          {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None}]))]
    assert got == [{"role": "system", "content": "ab"}, {"role": "assistant", "content": ""}]
    for raw in (None, []):
        assert refused(rules.messages, raw).param == "messages", raw
    assert refused(rules.messages, None, "input").param == "input"
    for raw, param in (("hi", "messages[0]"),
                       ({"role": "robot", "content": "x"}, "messages[0].role"),
                       ({"role": "user", "content": 3}, "messages[0].content"),
                       ({"role": "user", "content": [{"type": "image_url"}]},
                        "messages[0].content"),
                       ({"role": "user", "content": "\ud800"}, "messages[0].content")):
        assert refused(rules.message, raw, "messages[0]").param == param, raw


# What the openai client's ChatCompletionMessage.model_dump() gives for exod's own answer: a
# client that replays the turn sends it back as it came.
ECHOED_ANSWER = {"content": "hi", "refusal": None, "role": "assistant", "annotations": None,
                 "audio": None, "function_call": None, "tool_calls": None,
                 "reasoning_content": "because"}


def test_an_echoed_answer_reaches_the_template_without_its_empty_keys() -> None:
    """Which keys a message may hold is the dialect's table (test_fields); the rule takes
    what reaches the template."""
    assert rules.message(ECHOED_ANSWER, "messages[0]") == {
        "role": "assistant", "content": "hi", "reasoning_content": "because"}


def test_content_parts_are_text_parts_or_a_dialect_s_pictures() -> None:
    assert rules.content([{"type": "text", "text": "a"}], "c") == "a"
    assert refused(rules.content, [{"type": "image_url"}], "c").param == "c"
    shown = [{"type": "image", "image": 0}, {"type": "text", "text": "what?"}]
    assert rules.content(shown, "c") == shown
    assert refused(rules.content, [*shown, {"type": "image_url"}], "c").param == "c[2]"
    assert refused(rules.content, [*shown, {"type": "text", "text": "\ud800"}],
                   "c").param == "c[2]"


def test_reasoning_content_only_on_an_assistant_turn() -> None:
    assert rules.reasoning("r", "assistant", "p") == "r"
    assert refused(rules.reasoning, "r", "user", "p").param == "p"
    assert refused(rules.reasoning, 3, "assistant", "p").param == "p"
    assert refused(rules.message, {"role": "user", "content": "x", "reasoning_content": "r"},
                   "messages[1]").param == "messages[1].reasoning_content"
    assert "reasoning_content" not in rules.message(
        {"role": "user", "content": "x", "reasoning_content": None}, "messages[1]")


def test_prompt_is_one_string() -> None:
    assert rules.prompt("x") == "x" and rules.prompt(["x"]) == "x"
    for bad in (None, ["a", "b"], [1, 2], "", "\ud800"):
        assert refused(rules.prompt, bad).param == "prompt", bad


def test_prompt_ids_inside_the_vocabulary() -> None:
    rules.prompt_ids([0, 1023], 1024, "prompt")
    e = refused(rules.prompt_ids, [5, 1024], 1024, "prompt")
    assert e.param == "prompt" and "token id 1024" in str(e) and "(ids 0 to 1023)" in str(e)
    assert "token id -1" in str(refused(rules.prompt_ids, [-1], 1024, "messages"))
    assert str(refused(rules.prompt_ids, [], 1024, "messages")) == "the prompt is empty"


def test_max_tokens_is_a_positive_integer() -> None:
    assert rules.max_tokens(5) == 5 and rules.max_tokens(None, "max_tokens", 16) == 16
    for raw in (0, -1, 1.5, True, "9", None):  # None without a default: the runner's case
        assert refused(rules.max_tokens, raw).param == "max_tokens"
    e = refused(rules.max_tokens, 0, "max_completion_tokens", 9)
    assert e.param == "max_completion_tokens" and "at least 1" in str(e)


def test_think_budget_is_a_positive_integer_or_none() -> None:
    assert rules.think_budget(None) is None and rules.think_budget(8) == 8
    for bad in (0, -1, True, 2.0, "8", rules.MAX_THINK_BUDGET + 1):
        with pytest.raises(RequestError) as e:
            rules.think_budget(bad, "thinking.budget_tokens")
        assert e.value.param == "thinking.budget_tokens"


def test_max_tokens_is_clamped_to_the_context_window_and_the_cap() -> None:
    """As llama.cpp clamps to its server's limit: agents ask for 32000 whatever the model
    (issue 27); the generation ends at the bound with finish reason `length`."""
    assert rules.max_tokens_cap(2048, 2048, None) == 2048
    assert rules.max_tokens_cap(10**12, None, None) == 10**12  # nothing known
    assert rules.max_tokens_cap(32000, 2048, None) == 2048
    assert rules.max_tokens_cap(32000, 2048, 64) == 64
    assert rules.max_tokens_cap(9, 2048, 64) == 9


def test_a_number_below_another_field() -> None:
    assert rules.below(3, 4, "p", "q") == 3 and rules.below(9, None, "p", "q") == 9
    e = refused(rules.below, 4, 4, "thinking.budget_tokens", "max_tokens")
    assert e.param == "thinking.budget_tokens" and "less than `max_tokens`" in str(e)


def test_fit_window_keeps_every_position_inside() -> None:
    assert rules.fit_window(10, 5, 512, "prompt") == 5
    assert rules.fit_window(500, 100, 512, "prompt") == 12  # ends at the window
    assert rules.fit_window(10**6, 5, None, "prompt") == 5  # the model does not say
    for prompt in (511, 512, 10**6):
        allowed = prompt < 512
        try:
            assert rules.fit_window(prompt, 1, 512, "messages") == 1 and allowed
        except RequestError as e:
            assert not allowed and e.param == "messages" and "window of 512" in str(e)


@pytest.mark.parametrize("bias", [
    {"²": 1}, {"-1": 1}, {"1e3": 1}, {" 1": 1}, {"x": 1}, {"1": float("nan")},
    {"1": float("inf")}, {"1": 101}, {"1": -101}, {"1": True}, {"1": "1"}, {"12345678901": 1},
    [1, 2], "x", {str(i): 1 for i in range(rules.MAX_BIAS + 1)},
])
def test_logit_bias_shapes(bias: object) -> None:
    assert refused(rules.logit_bias, bias).param == "logit_bias"


def test_logit_bias_quotes_a_key_that_is_no_token_id_short() -> None:
    e = refused(rules.logit_bias, {"Z" * 50_000: 1})
    assert len(str(e)) < 100 and "'ZZZ" in str(e)


def test_logit_bias_taken_and_normalised() -> None:
    assert rules.logit_bias(None) == {} and rules.logit_bias({}) == {}
    assert rules.logit_bias({"0001": -100, "5": 1}) == {1: -100.0, 5: 1.0}
    assert len(rules.logit_bias({str(i): 1 for i in range(rules.MAX_BIAS)})) == rules.MAX_BIAS


def test_bias_ids_inside_the_vocabulary() -> None:
    rules.bias_ids([0, 1023], 1024)
    e = refused(rules.bias_ids, [3, 1024], 1024)
    assert e.param == "logit_bias"
    assert str(e) == ("`logit_bias`: token id 1024 is outside the model's vocabulary "
                      "(ids 0 to 1023)")


# ---- tools and structured output ----------------------------------------------------------------
FN = {"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}}


def test_name_is_openais_function_name() -> None:
    assert rules.name("get_weather.v2-x", "p") == "get_weather.v2-x"
    for bad in (None, "", "a b", "x" * 65, "é"):
        assert refused(rules.name, bad, "p").param == "p", bad


def test_depth_refuses_deep_nesting_without_recursion() -> None:
    deep: Any = "x"
    for _ in range(100_000):  # far past Python's recursion limit
        deep = [deep]
    assert refused(rules.depth, deep, "p").param == "p"
    rules.depth([[{"a": [1]}]], "p")
    for number in (float("inf"), float("nan")):
        assert refused(rules.depth, {"maximum": [number]}, "p").param == "p"


def test_plain_is_json_exod_can_write_back_at_any_depth() -> None:
    deep: Any = "x"
    for _ in range(100_000):
        deep = [deep]
    assert rules.plain(deep, "p") is deep  # no bound on nesting: the body's parser had one
    for bad in ({"a": ["\ud800"]}, {"\udfff": 1}, [float("nan")], {"b": float("-inf")}):
        assert refused(rules.plain, bad, "p").param == "p", bad


def test_schema_is_an_object_not_too_deep() -> None:
    assert rules.schema({"type": "object"}, "p") == {"type": "object"}
    for bad in (None, "x", [], True):
        assert refused(rules.schema, bad, "p").param == "p", bad


def test_tools_at_most_128_functions_with_unique_names() -> None:
    assert rules.tools(None) == []
    listed = rules.tools([{**FN, "function": {**FN["function"], "description": "d",
                                              "strict": True}}])
    assert rules.for_template(listed) == [
        {"type": "function", "function": {"name": "get", "description": "d",
                                          "parameters": {"type": "object"}}}]
    assert refused(rules.tools, [FN] * 2).param == "tools"
    assert refused(rules.tools, [FN] * 129).param == "tools"
    assert refused(rules.tools, "x").param == "tools"


def test_tool_is_a_function() -> None:
    for bad, param in (({"type": "x"}, "t"), ({"type": "function", "function": {}},
                                               "t.function.name"),
                       ({"type": "function", "function": {"name": "a", "parameters": 3}},
                        "t.function.parameters"),
                       ({"type": "function", "function": {"name": "a", "strict": 1}},
                        "t.function.strict"),
                       ({"type": "function", "function": {"name": "a", "description": 1}},
                        "t.function.description")):
        assert refused(rules.tool, bad, "t").param == param, bad


def test_strict_tools_are_named_apart_from_the_template_tools() -> None:
    listed = rules.tools([FN, {"type": "function", "function": {"name": "s", "strict": True}},
                          {"type": "function", "function": {"name": "n", "strict": False}}])
    assert all("strict" not in t and "strict" not in t["function"]
               for t in rules.for_template(listed))
    assert rules.strict_tools(listed) == ["s"] and rules.strict_tools([]) == []


def test_a_function_in_a_dialect_s_own_spelling() -> None:
    """Anthropic's tools hold `input_schema`: the error names it."""
    keys = ("name", "description", "input_schema", "strict")
    fn = rules.function({"name": "a", "input_schema": {"type": "object"}}, "tools[2]", keys)
    assert fn == {"type": "function", "function": {"name": "a",
                                                    "parameters": {"type": "object"}}}
    assert refused(rules.function, {"name": "a", "input_schema": 3}, "tools[2]",
                   keys).param == "tools[2].input_schema"
    assert refused(rules.unique, [fn, fn], "tools").param == "tools"


def test_a_call_in_a_dialect_s_own_spelling() -> None:
    keys = ("call_id", "name", "arguments")
    assert rules.call("c", "f", '{"a": 1}', "input[3]", keys) == {
        "id": "c", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}
    assert refused(rules.call, "c", "f", "[1]", "input[3]", keys).param == \
        "input[3].arguments"
    assert refused(rules.call, "c", "a b", "{}", "input[3]", keys).param == "input[3].name"


def test_flag_is_a_boolean() -> None:
    assert rules.flag(None, "p", True) is True and rules.flag(False, "p") is False
    assert refused(rules.flag, 1, "p").param == "p"


def test_text_field_is_text() -> None:
    assert rules.text_field("x", "p") == "x"
    for bad in (1, "\ud800"):
        assert refused(rules.text_field, bad, "p").param == "p"


def test_tool_choice_none_auto_required_or_a_listed_function() -> None:
    assert rules.tool_choice(None, []) == ("auto", None)
    assert rules.tool_choice("required", [FN]) == ("required", None)
    assert rules.tool_choice({"type": "function", "function": {"name": "get"}}, [FN]) == \
        ("function", "get")
    for bad, listed in (("required", []), ("any", [FN]),
                        ({"type": "function", "function": {"name": "launch"}}, [FN])):
        assert refused(rules.tool_choice, bad, listed).param == "tool_choice", bad
    assert rules.named("get", [FN], "tool_choice.name") == "get"
    assert refused(rules.named, "launch", [FN], "tool_choice.name").param == "tool_choice.name"
    assert refused(rules.choice, "required", [], "tool_choice").param == "tool_choice"


def test_response_format_text_object_or_schema() -> None:
    assert rules.response_format(None, "auto") is None
    assert rules.response_format({"type": "text"}, "auto") is None
    assert rules.response_format({"type": "json_object"}, "auto") == {"type": "json_object"}
    assert rules.response_format({"type": "json_schema", "json_schema": {
        "name": "s", "schema": {"type": "object"}, "strict": True}}, "auto") == {
        "type": "json_schema", "schema": {"type": "object"}, "strict": True}
    for bad, choice, param in (
            ({"type": "yaml"}, "auto", "response_format"),
            ({"type": "json_object"}, "required", "response_format"),
            ({"type": "json_schema"}, "auto", "response_format.json_schema"),
            ({"type": "json_schema", "json_schema": {"name": "a b"}}, "auto",
             "response_format.json_schema.name"),
            ({"type": "json_schema", "json_schema": {"name": "s", "schema": 1}}, "auto",
             "response_format.json_schema.schema"),
            # a schema beside a type that takes none would be ignored
            ({"type": "json_object", "json_schema": {}}, "auto", "response_format.json_schema")):
        assert refused(rules.response_format, bad, choice).param == param, bad


def test_schema_bytes_within_the_instance_limit() -> None:
    rules.schema_bytes(1024, 1024, "tools")
    assert refused(rules.schema_bytes, 1025, 1024, "tools").param == "tools"


def test_turn_keeps_tool_structure() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "get", "arguments": '{"a": 1}'}}
    assert rules.turn({"tool_calls": [call]}, "assistant", "m") == {"tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get", "arguments": {"a": 1}}}]}
    assert rules.turn({"tool_call_id": "c1"}, "tool", "m") == {"tool_call_id": "c1"}
    for raw, role, param in (({}, "tool", "m.tool_call_id"),
                             ({"tool_call_id": "c"}, "user", "m.tool_call_id"),
                             ({"name": "a b"}, "user", "m.name")):
        assert refused(rules.turn, raw, role, "m").param == param, raw


def test_every_string_a_runner_receives_is_text() -> None:
    """A lone surrogate anywhere in a schema, a call's arguments (object or JSON text), a call
    id or a template variable is a 400 naming the field, not a 500 when it is encoded."""
    e = refused(rules.schema, {"type": "object", "properties": {"\ud800": {}}}, "tools[0]")
    assert e.param == "tools[0]"
    assert refused(rules.schema, {"enum": ["a\udfff"]}, "s").param == "s"
    for args in ({"a": "\ud800"}, '{"a": "\\ud800"}'):
        e = refused(rules.past_call, {"function": {"name": "f", "arguments": args}}, "p")
        assert e.param == "p.function.arguments", args
    f = {"name": "f", "arguments": "{}"}
    assert refused(rules.past_call, {"id": "\ud800", "function": f}, "p").param == "p.id"
    assert refused(rules.past_call, {"id": 5, "function": f}, "p").param == "p.id"
    assert refused(rules.turn, {"tool_call_id": "\ud800"}, "tool", "m").param == \
        "m.tool_call_id"
    assert refused(rules.chat_template_kwargs, {"a": "\ud800"}).param == "chat_template_kwargs"


def test_past_calls_only_from_the_assistant() -> None:
    assert refused(rules.past_calls, [], "user", "p").param == "p"
    assert refused(rules.past_calls, [{}] * 129, "assistant", "p").param == "p"


def test_past_call_arguments_as_text_or_object() -> None:
    f = {"name": "get", "arguments": {"a": [1]}}
    assert rules.past_call({"function": f}, "p")["function"] == f
    assert rules.past_call({"function": {"name": "get", "arguments": ""}}, "p")[
        "function"]["arguments"] == {}
    for args in ("{", "[1]", 3, "[" * 100_000):
        e = refused(rules.past_call, {"function": {"name": "get", "arguments": args}}, "p")
        assert e.param == "p.function.arguments", args
    assert refused(rules.past_call, {"function": "x"}, "p").param == "p"


def test_past_call_keys_are_a_function_call() -> None:
    f = {"name": "get", "arguments": "{}"}
    assert rules.past_call({"id": "c", "type": "function", "index": 0, "function": f}, "p")[
        "id"] == "c"  # index: a call reassembled from a stream
    assert refused(rules.past_call, {"type": "custom", "function": f}, "p").param == "p"


# ---- the rest of the sampling set, logprobs, chat_template_kwargs ------------------------------
def test_min_p_and_the_openai_penalties_are_numbers_in_range() -> None:
    assert rules.number("min_p", None) == 0.0 and rules.number("min_p", 1) == 1.0
    assert rules.number("presence_penalty", -2) == -2.0
    assert rules.number("frequency_penalty", None) == 0.0
    for name, bad in (("min_p", 1.5), ("min_p", -0.1), ("presence_penalty", 2.01),
                      ("frequency_penalty", float("nan")), ("presence_penalty", float("-inf")),
                      ("frequency_penalty", 1e308), ("min_p", True)):
        assert refused(rules.number, name, bad).param == name


def test_top_k_is_an_integer_0_or_minus_1_for_off() -> None:
    assert rules.top_k(None) == 0 and rules.top_k(-1) == -1 and rules.top_k(50) == 50
    assert rules.top_k(rules.MAX_TOP_K) == rules.MAX_TOP_K
    for bad in (-2, 1.5, True, "5", rules.MAX_TOP_K + 1, 10**30):
        assert refused(rules.top_k, bad).param == "top_k"


def test_repetition_penalty_is_a_positive_factor() -> None:
    assert rules.repetition_penalty(None) == 1.0 and rules.repetition_penalty(1.3) == 1.3
    for bad in (0, -1, 10.5, float("nan"), float("inf"), True, "1"):
        assert refused(rules.repetition_penalty, bad).param == "repetition_penalty"


def test_context_sizes_are_positive_integers() -> None:
    for name in rules.CONTEXT_SIZES:
        assert rules.context_size(name, None) == 20 and rules.context_size(name, 1) == 1
        for bad in (0, -5, 2.0, True, rules.MAX_CONTEXT_SIZE + 1):
            assert refused(rules.context_size, name, bad).param == name


def test_logprobs_and_top_logprobs() -> None:
    assert rules.logprobs(None) is False and rules.logprobs(True) is True
    assert refused(rules.logprobs, 1).param == "logprobs"
    assert rules.top_logprobs(None, False) == 0 and rules.top_logprobs(20, True) == 20
    for bad in (-1, 21, 10**9, 2.0, True):
        assert refused(rules.top_logprobs, bad, True).param == "top_logprobs"
    assert "needs `logprobs: true`" in str(refused(rules.top_logprobs, 3, False))


def test_completion_logprobs_is_a_count() -> None:
    assert rules.completion_logprobs(None) is None and rules.completion_logprobs(0) == 0
    assert rules.completion_logprobs(5) == 5
    for bad in (-1, 21, True, 1.0, "5"):
        assert refused(rules.completion_logprobs, bad).param == "logprobs"


def test_chat_template_kwargs_are_small_plain_variables() -> None:
    assert rules.chat_template_kwargs(None) == {}
    ok = {"enable_thinking": False, "effort": ["a", 1, {"b": None}]}
    assert rules.chat_template_kwargs(ok) == ok
    for bad in ([], "x", {"chat_template": "{{ 7*7 }}"}, {"tools": []},
                {"add_generation_prompt": False}, {"1x": 1}, {"a-b": 1}, {"": 1},
                {f"k{i}": i for i in range(rules.MAX_TEMPLATE_KWARGS + 1)},
                {"big": "x" * rules.MAX_TEMPLATE_KWARGS_CHARS}, {"nan": float("nan")}):
        assert refused(rules.chat_template_kwargs, bad).param == "chat_template_kwargs"


def test_chat_template_kwargs_are_nested_no_deeper_than_a_schema() -> None:
    """The daemon writes a request to its runner by recursion (exod.wire.protocol.to_wire): a
    variable nested 500 lists deep (1,000 bytes) overflowed Python's stack there, a 500 after
    the request was admitted."""
    def nested(n: int) -> dict[str, Any]:
        v: Any = 0
        for _ in range(n - 2):  # n levels: the object itself the first, the 0 the last
            v = [v]
        return {"x": v}
    deepest = nested(rules.MAX_SCHEMA_DEPTH)
    assert rules.chat_template_kwargs(deepest) == deepest
    gen = Generate(id="r", kind="chat", messages=[{"role": "user", "content": "q"}],
                   max_tokens=1, chat_template_kwargs=deepest)
    assert decode_to_runner(json.loads(json.dumps(to_wire(gen)))) == gen
    for n in (rules.MAX_SCHEMA_DEPTH + 1, 500):
        e = refused(rules.chat_template_kwargs, nested(n))
        assert e.param == "chat_template_kwargs" and "nested more than 64" in str(e)


def test_stream_options_flags_are_booleans() -> None:
    assert rules.stream_options({"include_usage": True, "include_obfuscation": False}, True)
    e = refused(rules.stream_options, {"include_obfuscation": "no"}, True)
    assert e.param == "stream_options.include_obfuscation"


def test_generic_shapes_name_the_field() -> None:
    assert rules.obj({}, "p") == {} and refused(rules.obj, [], "p").param == "p"
    assert rules.array([1], "p", 1) == [1]
    for raw in ({}, [1, 2]):
        assert refused(rules.array, raw, "p", 1).param == "p"
    assert "non-empty" in str(refused(rules.array, [], "p", None, True))
    assert rules.one_of("a", ("a", "b"), "p") == "a"
    for bad in ("c", ["a"], None):
        assert "must be one of a, b" in str(refused(rules.one_of, bad, ("a", "b"), "p"))
    assert refused(rules.required, None, "max_tokens").param == "max_tokens"
