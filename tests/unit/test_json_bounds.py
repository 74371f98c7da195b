"""The bounds on the JSON a grammar allows (exod.runner.serving.json_bounds): what `bounded`
does to a schema, checked through the grammar engine itself (llguidance, one byte per token:
tests.unit.accepts), and that on schemas made by agent libraries (pydantic, LangChain, the
OpenAI Agents SDK) a writer that picks any byte the grammar allows, as a degenerate model does,
always ends, and always writes a document valid against the client's own schema."""

from __future__ import annotations

import copy
import datetime
import json
import random
from typing import Any

import jsonschema
import llguidance
import numpy as np
import pytest

from exod.runner.serving.json_bounds import (
    ANY_DEPTH,
    INT_BOUND,
    JSON_OBJECT,
    KEY_CHARS,
    bounded,
    json_rule,
    options,
)
from exod.runner.serving.strict_args import EOS, byte_tokenizer
from tests.library_schemas import SDK, Address, Person, Scores, Unit, all_schemas, small_schemas
from tests.unit.accepts import accepts


def grammar(schema: Any, strict: bool = False) -> str:
    return llguidance.LLMatcher.grammar_from_json_schema(json.dumps(bounded(schema)),
                                                         overrides=options(strict))


def allows(schema: Any, *texts: str) -> list[bool]:
    g = grammar(schema)
    return [accepts(g, t) for t in texts]


# ---- keys -----------------------------------------------------------------------------------
def test_no_key_beyond_properties_unless_additional_properties_allows_it() -> None:
    open_ = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert allows(open_, '{"a":1}', "{}", '{"a":1,"b":2}', '{"b":2}') == [True, True, False,
                                                                          False]
    assert allows({"type": "object"}, "{}", '{"a":1}') == [True, False]
    extra = {**open_, "additionalProperties": True}
    assert allows(extra, '{"a":1,"b":[{"c":null}]}', '{"a":"x"}') == [True, False]
    typed = {**open_, "additionalProperties": {"type": "string", "maxLength": 2}}
    long_key = '{"' + "k" * (KEY_CHARS + 1) + '":"x"}'
    assert allows(typed, '{"a":1,"b":"xy"}', '{"b":3}', long_key) == [True, False, False]


def test_a_required_key_the_properties_do_not_describe_stays_allowed() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "b"]}
    assert allows(schema, '{"a":1,"b":{"x":[1]}}', '{"a":1}', '{"a":1,"b":1,"c":1}') == [
        True, False, False]


def test_extra_keys_are_of_bounded_length() -> None:
    long_key = '{"' + "k" * (KEY_CHARS + 1) + '":1}'
    for schema in (JSON_OBJECT, {"type": "object", "additionalProperties": {"type": "integer"}}):
        assert allows(schema, '{"' + "k" * KEY_CHARS + '":1}', long_key) == [True, False]


def test_objects_merged_with_others_are_left_open() -> None:
    """Closing a member of an allOf (or a $ref beside properties) would forbid the keys of the
    others: those stay as the client wrote them, and still compile."""
    both = {"allOf": [{"properties": {"a": {"type": "integer"}}},
                      {"properties": {"b": {"type": "integer"}}}]}
    assert allows(both, '{"a":1,"b":2}') == [True]
    beside = {"$defs": {"B": {"type": "object", "properties": {"a": {"type": "integer"}}}},
              "$ref": "#/$defs/B", "properties": {"x": {"type": "integer"}}}
    assert allows(beside, '{"a":1,"x":2}') == [True]
    assert bounded(beside)["$defs"]["B"].get("additionalProperties") is None
    # Members that only require keys are no merge: the object is closed.
    either = {"type": "object", "properties": {"a": {}, "b": {}},
              "anyOf": [{"required": ["a"]}, {"required": ["b"]}]}
    assert allows(either, '{"a":1}', '{"b":1}', '{"a":1,"c":1}', "{}") == [True, True, False,
                                                                           False]


def test_the_branches_of_a_union_are_closed_each() -> None:
    schema = {"anyOf": [{"$ref": "#/$defs/A"}, {"type": "null"}],
              "$defs": {"A": {"type": "object", "properties": {"x": {"type": "integer"}}}}}
    assert allows(schema, '{"x":1}', "null", '{"x":1,"y":2}') == [True, True, False]


# ---- items, numbers, formats, free values, whitespace ----------------------------------------
def test_no_item_past_a_tuples_own() -> None:
    assert allows({"type": "array", "prefixItems": [{"type": "integer"}]}, "[1]", "[1,2]") == [
        True, False]
    assert allows({"type": "array", "items": [{"type": "integer"}]}, "[1]", "[1,2]") == [
        True, False]
    assert allows({"type": "array", "prefixItems": [{"type": "integer"}], "items": True},
                  "[1,2]") == [True]


def test_integers_have_at_most_16_digits_where_the_schema_sets_no_bound() -> None:
    digits16, digits17 = "9" * 16, "1" + "0" * 16 + "1"
    assert allows({"type": "integer"}, digits16, "-" + digits16, str(INT_BOUND), digits17,
                  "1e3") == [True, True, True, False, False]
    assert allows({"type": "integer", "minimum": 0}, digits16, "-1") == [True, False]
    assert allows({"type": "integer", "maximum": 10 ** 18}, "1" + "0" * 18) == [True]


def test_numbers_have_bounded_fraction_digits_and_no_exponent() -> None:
    assert allows({"type": "number"}, "1.5", "-0.25", "12", "0." + "1" * 10, "0." + "1" * 11,
                  "1e5", "1.5E-3") == [True, True, True, True, False, False, False]
    assert allows({"type": "number", "minimum": 0, "maximum": 1}, "0.5", "0." + "3" * 11) == [
        True, False]
    assert allows({"type": "number", "multipleOf": 0.5}, "2.5", "0.25") == [True, False]
    # A list of types: each keyword bounds its own type.
    assert allows({"type": ["number", "string"]}, '"x"', "1." + "0" * 11) == [True, False]


def test_times_have_a_maximum_length() -> None:
    schema = {"type": "string", "format": "date-time"}
    assert allows(schema, '"2024-05-01T12:00:00.123456789+02:00"',
                  '"2024-05-01T12:00:00.' + "1" * 30 + 'Z"') == [True, False]


def test_free_values_are_nested_at_most_any_depth_deep() -> None:
    def nested(n: int) -> str:
        return '{"a":' + "[" * n + "1" + "]" * n + "}"

    assert allows(JSON_OBJECT, nested(ANY_DEPTH - 1), nested(ANY_DEPTH + 1)) == [True, False]
    assert allows({"type": "array"}, '[1,"x",null,{"k":[true]}]', "[1e400]") == [True, False]
    assert allows(True, '{"a":1}', "1" * 17) == [True, False]


def test_json_is_compact() -> None:
    assert allows({"type": "object", "properties": {"a": {"type": "array"}}},
                  '{"a":[1,2]}', '{"a": [1,2]}', '{"a":[1, 2]}', ' {"a":[]}') == [
        True, False, False, False]


def test_the_input_is_left_as_it_is_and_bounding_twice_changes_nothing() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "number"}, "b": {}},
              "required": ["c"]}
    before = copy.deepcopy(schema)
    once = bounded(schema)
    assert schema == before and bounded(once) == once


def test_a_lark_rule_carries_the_options() -> None:
    rule = json_rule({"type": "object"}, strict=True)
    assert rule.startswith("%json ") and json.loads(rule[6:])["x-guidance"] == options(True)
    assert accepts(f"start: {rule}\n", "{}") and not accepts(f"start: {rule}\n", '{"a":1}')


# ---- schemas agent libraries make -------------------------------------------------------------
def walk(g: str, rng: random.Random, limit: int = 4000) -> str | None:
    """A document written by picking, byte after byte, any byte the grammar allows (the end
    included, when allowed): a degenerate model's way. None if it runs past `limit` bytes."""
    matcher = llguidance.LLMatcher(byte_tokenizer(), g, log_level=0)
    words = np.zeros((EOS + 32) // 32, dtype=np.uint32)
    out = bytearray()
    while len(out) < limit:
        matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
        mask = np.unpackbits(words.view(np.uint8), bitorder="little")[:EOS + 1]
        allowed = np.flatnonzero(mask).tolist()
        assert allowed, matcher.get_error()
        b = rng.choice(allowed)
        if b == EOS:
            return out.decode("utf-8")
        assert matcher.consume_token(b)
        out.append(b)
    return None


@pytest.mark.parametrize("what, schema, strict", all_schemas(),
                         ids=[w for w, _, _ in all_schemas()])
def test_a_degenerate_writer_always_ends_with_a_valid_document(what: str, schema: Any,
                                                               strict: bool) -> None:
    g = grammar(schema, strict)
    rng = random.Random(what)
    for _ in range(25):
        doc = walk(g, rng)
        assert doc is not None, f"{what}: the grammar let the writer run on"
        jsonschema.validate(json.loads(doc), schema)


def test_documents_within_the_bounds_are_all_still_allowed() -> None:
    person = Person(name="Ada", age=36, score=0.5, unit=Unit.C, tags=["a", "c"],
                    home=Address(city="Oslo", zip=150), born=datetime.date(1815, 12, 10),
                    seen=datetime.datetime(2024, 5, 1, 12, 0, 0, 123456, datetime.timezone.utc))
    assert allows(Person.model_json_schema(), person.model_dump_json()) == [True]
    scores = Scores(by_name={"x": 1, "y": -2}, pair=(3, True))
    assert allows(Scores.model_json_schema(), scores.model_dump_json()) == [True]
    contact = {"name": "Bo", "age": 3, "score": 1.25, "priority": "low",  # the schema's order
               "home": {"street": "Main", "number": 4, "city": None}, "tags": ["work"]}
    assert allows(SDK["outputs"]["Contact"], json.dumps(contact, separators=(",", ":"))) == [
        True]


def most_bytes(schema: Any, root: Any) -> int:
    """The longest document `schema` (bounded) allows, in bytes, for the shapes the small
    library schemas have; a string's character may be a 12-byte escaped surrogate pair."""
    if "$ref" in schema:
        node = root
        for part in schema["$ref"][2:].split("/"):
            node = node[part]
        return most_bytes(node, root)
    if "anyOf" in schema:
        return max(most_bytes(s, root) for s in schema["anyOf"])
    if "enum" in schema or "const" in schema:
        return max(len(json.dumps(v, separators=(",", ":"))) for v in
                   schema.get("enum", [schema.get("const")]))
    kind = schema["type"]
    if kind == "object":
        props = schema["properties"]
        return 2 + len(props) - 1 + sum(len(json.dumps(k)) + 1 + most_bytes(v, root)
                                        for k, v in props.items())
    if kind == "string":
        return 2 + 12 * schema["maxLength"]
    if kind in ("integer", "number"):
        ends = max(len(str(int(schema["minimum"]))), len(str(int(schema["maximum"]))))
        return ends + (1 + 10 if kind == "number" else 0)
    return {"boolean": 5, "null": 4}[kind]


@pytest.mark.parametrize("what, schema, strict", small_schemas(),
                         ids=[w for w, _, _ in small_schemas()])
def test_the_small_library_schemas_fit_in_200_tokens(what: str, schema: Any,
                                                      strict: bool) -> None:
    """The integration tests ask every answer of these to be valid within max_tokens 200: a
    token is at least a byte."""
    b = bounded(schema)
    assert most_bytes(b, b) <= 200
