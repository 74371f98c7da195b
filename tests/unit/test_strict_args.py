"""Strict tools' arguments checked after a call is parsed (exod.runner.serving.strict_args), by
the grammar engine that forces calls: in any key order, with the engine's linear-time regular
expressions, and a schema it cannot take whole refused by name where the request is read."""

from __future__ import annotations

import time
from typing import Any

import pytest

from exod.wire.options import GrammarLimits
from exod.core.request_rules import RequestError
from exod.runner.serving.strict_args import ArgsCheck, canonical, ordered


def check(params: dict[str, Any], name: str = "f") -> ArgsCheck:
    return ArgsCheck([{"type": "function", "function": {"name": name, "parameters": params}}],
                     [name], GrammarLimits())


def test_keys_in_any_order_are_put_in_the_schemas_order() -> None:
    inner = {"type": "object", "properties": {"x": {}, "y": {}}}
    schema = {"$defs": {"p": inner}, "type": "object",
              "properties": {"a": {"$ref": "#/$defs/p"}, "b": {"type": "array", "items": inner}},
              "anyOf": [{"properties": {"c": {}}}]}
    got = ordered({"z": 0, "c": 1, "b": [{"y": 1, "x": 2}], "a": {"y": 1, "x": 2}}, schema)
    assert list(got) == ["a", "b", "c", "z"]
    assert list(got["a"]) == ["x", "y"] and list(got["b"][0]) == ["x", "y"]


def test_canonical_json_is_compact_with_integral_floats_as_integers() -> None:
    assert canonical({"a": 1.0, "b": [2.5, "\x7f"]}) == '{"a":1,"b":[2.5,"\\u007f"]}'
    # As a bounded number is written: no exponent (exod.runner.serving.json_bounds).
    assert canonical([1e-05, 1.5e20, -0.0, True, None]) == \
        '[0.00001,150000000000000000000,0,true,null]'


def test_a_strict_call_is_checked_against_the_bounds_a_forced_one_follows() -> None:
    """No additionalProperties means no key beyond properties; numbers of at most 16
    integral digits: the same calls are allowed whether forced or checked afterwards."""
    c = check({"type": "object", "properties": {"n": {"type": "integer"},
                                                "x": {"type": "number"}}})
    assert c.error("f", '{"x": 0.00001, "n": 9999999999999999}') is None
    for bad in ('{"n": 1, "m": 2}', '{"n": 99999999999999999}', '{"x": 1e-12}'):
        assert c.error("f", bad), bad


def test_arguments_validate_or_say_why() -> None:
    c = check({"type": "object", "properties": {"n": {"type": "integer", "minimum": 1},
                                                "s": {"enum": ["a", "b"]}},
               "required": ["n"], "additionalProperties": False})
    assert c.error("f", '{"s": "a", "n": 1.0}') is None
    assert c.error("other", '{"whatever": 1}') is None  # not a strict tool
    for bad in ('{"n": 0}', '{"s": "a"}', '{"n": 1, "s": "c"}', '{"n": 1, "t": 1}'):
        assert c.error("f", bad), bad
    assert c.error("f", '{"n": 2}') is None  # an error before leaves the next check fresh


def test_a_schema_the_engine_cannot_take_whole_is_refused_by_name() -> None:
    for params in ({"type": "array", "uniqueItems": True}, {"type": "string",
                                                           "pattern": "(?=a)b"}):
        with pytest.raises(RequestError) as e:
            check(params)
        assert e.value.param == "tools[0].function.parameters"


def test_a_pathological_pattern_is_checked_in_linear_time() -> None:
    c = check({"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}})
    t = time.monotonic()
    assert c.error("f", '{"s": "' + "a" * 5000 + 'b"}')
    assert c.error("f", '{"s": "' + "a" * 5000 + '"}') is None
    assert time.monotonic() - t < 2
