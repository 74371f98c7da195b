"""The agent fields fuzzed as #11 fuzzed the others: near-valid and random values of `tools`,
`tool_choice`, `parallel_tool_calls`, `response_format` and the tool structure of `messages`
either make a request that survives the wire to the runner, or a 400 naming a field; never
another exception (which the API would answer with a 5xx)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from exod.api.errors import ApiError
from exod.api.dialects.openai.request import parse_chat
from exod.api.request import ModelLimits, apply_limits
from exod.wire.messages import decode_to_runner, to_wire

# Python's JSON reads `Infinity` and `NaN` too: they must be refused, not sent to a runner.
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=3),
    max_leaves=12)
FN = {"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}}
NEAR: dict[str, Any] = {
    "tools": st.one_of(JSON, st.lists(st.one_of(st.just(FN), st.fixed_dictionaries(
        {"type": st.just("function"), "function": st.dictionaries(
            st.sampled_from(["name", "parameters", "description", "strict"]), JSON)})),
        max_size=3)),
    "tool_choice": st.one_of(JSON, st.sampled_from(["none", "auto", "required"]),
                             st.fixed_dictionaries({"type": st.just("function"),
                                                    "function": st.dictionaries(
                                                        st.just("name"), JSON)})),
    "parallel_tool_calls": JSON,
    "response_format": st.one_of(JSON, st.fixed_dictionaries({
        "type": st.sampled_from(["text", "json_object", "json_schema"]),
        "json_schema": st.dictionaries(st.sampled_from(["name", "schema", "strict"]), JSON)})),
}
TURN = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "tool"]),
                              "content": st.one_of(st.none(), st.text(max_size=5))},
                             optional={"tool_calls": st.one_of(JSON, st.lists(
                                 st.fixed_dictionaries({"id": JSON, "function": st.dictionaries(
                                     st.sampled_from(["name", "arguments"]),
                                     st.one_of(JSON, st.just("get"), st.just('{"a": 1}')))}),
                                 max_size=2)),
                                 "tool_call_id": JSON, "name": JSON})


@settings(max_examples=400, deadline=None)
@given(st.fixed_dictionaries({}, optional=NEAR), st.lists(TURN, min_size=1, max_size=3))
def test_agent_fields_are_served_or_refused_by_name(fields: dict[str, Any],
                                                    turns: list[dict[str, Any]]) -> None:
    body = {"model": "m", "messages": turns, **fields}
    try:
        req = apply_limits(parse_chat(body), ModelLimits(1000, 4096))
    except ApiError as e:
        assert e.status == 400 and e.message
        return
    assert decode_to_runner(json.loads(json.dumps(to_wire(req.gen)))) == req.gen
