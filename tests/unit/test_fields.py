"""The field policy (exod.api.fields): every field of the newest official clients' request
types is in a table; a body is read against its table (unknown fields ignored and reported,
or refused under strict_fields; hosted tools never refused); what was ignored is counted with
a bounded label set and named in a safe header; and the docs page is the tables' own
rendering. No processes, no mlx."""

from __future__ import annotations

import typing
from typing import Any

import pytest
from anthropic.types.beta import beta_content_block_param, beta_tool_union_param
from anthropic.types.beta import message_count_tokens_params, message_create_params
from openai.types import completion_create_params as completion_params
from openai.types import embedding_create_params as embedding_params
from openai.types.chat import completion_create_params as chat_params
from openai.types.responses import response_create_params, response_includable
from openai.types.responses import response_input_item_param, tool_param

from exod.api.errors import ApiError
from exod.api.dialects.anthropic.fields import MESSAGES
from exod.api.dialects.embeddings.fields import EMBEDDINGS
from exod.api.dialects.openai.fields import CHAT, COMPLETION
from exod.api.dialects.responses.fields import RESPONSES
from exod.api.dialects import DIALECTS
from exod.api.fields import Reading, Support
from exod.api.ignored import HEADER, MAX_HEADER_NAMES, MORE, IgnoredFields, header
from exod.api.dialects.openai.request import parse_chat, parse_completion
from exod.core.request_rules import RequestError
from tests.field_docs import PAGE, render

CHAT_BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def type_values(union: Any) -> set[str]:
    """The `type` literals of a union of an SDK's TypedDicts."""
    out: set[str] = set()
    for member in typing.get_args(union):
        if typing.get_origin(member) is typing.Annotated:
            continue
        hint = typing.get_type_hints(member).get("type")
        for arg in typing.get_args(hint) or (hint,):
            out |= {a for a in typing.get_args(arg) or (arg,) if isinstance(a, str)}
    return out


# ---- every field of the clients is in a table --------------------------------------------------
@pytest.mark.parametrize("params, dialect, kind", [
    (chat_params.CompletionCreateParamsBase, CHAT, "body"),
    (completion_params.CompletionCreateParamsBase, COMPLETION, "body"),
    (response_create_params.ResponseCreateParamsBase, RESPONSES, "body"),
    (message_create_params.MessageCreateParamsBase, MESSAGES, "body"),
    (message_count_tokens_params.MessageCountTokensParams, MESSAGES, "count"),
    (embedding_params.EmbeddingCreateParams, EMBEDDINGS, "body"),
])
def test_every_field_of_the_newest_clients_is_in_a_table(params: Any, dialect: Any,
                                                         kind: str) -> None:
    theirs = set(typing.get_type_hints(params))
    assert theirs - set(dialect.objects[kind].keys) == set()


@pytest.mark.parametrize("union, dialect, kind", [
    (beta_content_block_param.BetaContentBlockParam, MESSAGES, "block"),
    (beta_tool_union_param.BetaToolUnionParam, MESSAGES, "tool"),
    (tool_param.ToolParam, RESPONSES, "tool"),
    (response_input_item_param.ResponseInputItemParam, RESPONSES, "item"),
])
def test_every_type_of_block_tool_and_item_is_in_a_table(union: Any, dialect: Any,
                                                         kind: str) -> None:
    variants = dialect.variants[kind]
    assert {v for v in type_values(union) if variants.get(v) is None} == set()


def test_every_include_value_is_in_the_table() -> None:
    values = set(typing.get_args(response_includable.ResponseIncludable))
    assert {v for v in values if RESPONSES.variants["include"].get(v) is None} == set()


def test_what_the_agents_send_is_never_refused() -> None:
    """Issue 27's list, class by class: works or no effect, never refused."""
    rows = {("messages", "body", key) for key in (
        "context_management", "metadata", "thinking", "output_config", "cache_control")}
    rows |= {("responses", "body", key) for key in (
        "client_metadata", "prompt_cache_key", "include", "reasoning", "parallel_tool_calls")}
    tables = {d.name: d for d in DIALECTS}
    for dialect, kind, key in sorted(rows):
        assert tables[dialect].objects[kind].keys[key].kind in (Support.WORKS, Support.INERT), key
    for kind in ("web_search", "file_search", "code_interpreter", "computer_use_preview",
                 "mcp", "image_generation", "local_shell"):
        assert RESPONSES.variants["tool"].get(kind).kind is Support.IGNORED, kind  # type: ignore[union-attr]
    for kind in ("web_search_20250305", "bash_20250124", "text_editor_20250728",
                 "code_execution_20250825"):
        assert MESSAGES.variants["tool"].get(kind).kind is Support.IGNORED, kind  # type: ignore[union-attr]


def test_every_row_says_what_exod_does() -> None:
    for dialect in DIALECTS:
        for obj in dialect.objects.values():
            assert all(row.doc for row in obj.keys.values()), obj.path
            assert all(row.why for row in obj.keys.values() if row.kind is Support.REFUSED)
        for variants in dialect.variants.values():
            assert all(row.doc for row in variants.values.values()), variants.path


def test_the_docs_page_is_rendered_from_the_tables() -> None:
    """Run `python -m tests.field_docs` after changing a table."""
    assert PAGE.read_text(encoding="utf-8") == render(DIALECTS)


# ---- reading a body against its table ---------------------------------------------------------
def test_unknown_fields_are_ignored_and_named_once_without_indexes() -> None:
    req = parse_chat({**CHAT_BODY, "x_future_field": True, "messages": [
        {"role": "user", "content": "a", "x": 1}, {"role": "user", "content": "b", "x": 2}]})
    assert req.ignored == ("x_future_field", "messages[].x")
    assert parse_completion({"model": "m", "prompt": "x", "chat_template_kwargs": {}}
                            ).ignored == ("chat_template_kwargs",)


def test_strict_fields_refuse_what_exod_does_not_know_by_name() -> None:
    for body, param in (({**CHAT_BODY, "x_future_field": True}, "x_future_field"),
                        ({**CHAT_BODY, "tools": [{"type": "web", "x": 1}]}, "tools[0].type")):
        with pytest.raises(ApiError) as e:
            parse_chat(body, strict=True)
        assert e.value.param == param and "strict_fields" in e.value.message


def test_refused_fields_pass_when_their_value_asks_for_nothing() -> None:
    parse_chat({**CHAT_BODY, "user": "u", "store": True, "metadata": {}, "n": 1,
                "service_tier": "flex", "modalities": ["text"], "audio": None,
                "tools": [], "tool_choice": "none", "response_format": {"type": "text"},
                "parallel_tool_calls": False})
    parse_completion({"model": "m", "prompt": "x", "best_of": 1, "suffix": None, "user": "u",
                      "echo": False})
    for extra in ({"reasoning_effort": "low"}, {"modalities": ["audio"]}, {"n": 2},
                  {"web_search_options": {}}, {"functions": []}):
        with pytest.raises(ApiError) as e:
            parse_chat({**CHAT_BODY, **extra})
        assert e.value.param == next(iter(extra))
    for extra in ({"best_of": 2}, {"echo": True}, {"suffix": "x"}):
        with pytest.raises(ApiError) as e:
            parse_completion({"model": "m", "prompt": "x", **extra})
        assert e.value.param == next(iter(extra))


# What the openai client's ChatCompletionMessage.model_dump() gives for exod's own answer: a
# client that replays the turn sends it back as it came.
ECHOED = {"content": "hi", "refusal": None, "role": "assistant", "annotations": None,
          "audio": None, "function_call": None, "tool_calls": None, "reasoning_content": "r"}


def test_an_answer_sent_back_passes_and_what_it_cannot_replay_is_refused() -> None:
    req = parse_chat({"model": "m", "messages": [ECHOED, {"role": "user", "content": "x"}]})
    assert req.gen.messages[0] == {"role": "assistant", "content": "hi",
                                   "reasoning_content": "r"} and req.ignored == ()
    for key, value in (("audio", {"id": "a1"}), ("refusal", "I cannot"),
                       ("annotations", [{"type": "url_citation"}]),
                       ("function_call", {"name": "f", "arguments": "{}"})):
        with pytest.raises(ApiError) as e:
            parse_chat({"model": "m", "messages": [{**ECHOED, key: value}]})
        assert e.value.param == f"messages[0].{key}", key


def test_a_variant_s_value_is_checked_without_a_type_key() -> None:
    r = Reading(RESPONSES)
    assert r.variant("reasoning.encrypted_content", "include", "include[0]", key="")
    assert not r.variant("web_search_call.results", "include", "include[1]", key="")
    assert not r.variant("future.thing", "include", "include[2]", key="")
    assert r.ignored == ("include[]=future.thing",)
    with pytest.raises(RequestError) as e:
        r.variant("message.output_text.logprobs", "include", "include[3]", key="")
    assert e.value.param == "include[3]"


def test_an_ignored_key_s_name_is_bounded() -> None:
    r = Reading(CHAT)
    r.keys({"k" * 500: 1}, "body")
    assert r.ignored == ("k" * 64,)


# ---- what was ignored: counted, logged once, named in a header ---------------------------------
def test_ignored_fields_are_counted_with_a_bounded_label_set() -> None:
    seen = IgnoredFields(limit=3)
    for _ in range(2):
        seen.record("chat", ["a", "b"])
    seen.record("chat", ["c", "d", "e"])
    seen.record("messages", ["a"])
    assert seen.counts == {("chat", "a"): 2, ("chat", "b"): 2, ("chat", "c"): 1,
                           ("chat", MORE): 2, ("messages", MORE): 1}


def test_the_header_names_what_was_ignored_safely_and_briefly() -> None:
    assert header([]) == {}
    assert header(["a", "tools[].type=web search,\r\nX: y"]) == {
        HEADER: "a, tools[].type=web?search???X:?y"}
    many = header([f"f{i}" for i in range(MAX_HEADER_NAMES + 5)])[HEADER]
    assert many.endswith(", ...5 more") and many.count(",") == MAX_HEADER_NAMES
