"""Tools and constrained decoding end to end, with the official `openai` client, against real
runners of random-weight tiny models: forced tool calls that validate against the tool's
parameters, schema-valid JSON across many schemas, streamed tool-call deltas that reassemble, a
tool round trip whose result reaches the prompt, a batch mixing constrained and free requests
(each gets its solo tokens), a 2-rank group, and hostile schemas (4xx in seconds, never 5xx,
while a stream on the same instance keeps its pace). A thinking model thinks, then answers in
the grammar (tests.models.thinking); `tool_choice: auto` reads calls with mlx-lm's parser from a
model steered to write one (tests.models.caller).

A random model rarely closes a free string on its own: schemas here bound their strings
(maxLength, enum, pattern) and close their objects (additionalProperties false); where a
string is free, `logit_bias` favours the characters that close it, as a real model would. The
grammar alone decides validity: a bias cannot lift its mask.

Schemas made by agent libraries (tests.library_schemas: pydantic, LangChain, the OpenAI Agents
SDK) close no object and bound no number; exod bounds them (exod.runner.serving.json_bounds).
With no bias at all, every answer on them is valid, in every dialect that takes a schema:
chat's response_format and forced tools, a strict tool's call under `auto`, Anthropic's
output_config.format and tool forcing, Responses' text.format and forced tools.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anthropic
import jsonschema
import openai
import pytest

from tests.library_schemas import small_schemas
from tests.models.caller import make_caller_model
from tests.models.thinking import make_thinking_model
from tests.models.tiny import with_tool_template
from tests.harness import Daemon

HELLO = [{"role": "user", "content": "hello"}]
# The tiny tokenizer's `"`, `}`, `]` and end of sequence (allowed by a grammar only once its
# output is complete).
CLOSERS = {"4": 8.0, "95": 8.0, "63": 8.0, "2": 8.0}
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 14}},
    "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer", "maximum": 999},
                                         "b": {"type": "integer", "maximum": 999}},
        "required": ["a", "b"], "additionalProperties": False}}},
]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": {"n": {"type": "integer", "maximum": 10 ** 6}},
     "required": ["n"], "additionalProperties": False},
    {"type": "object", "properties": {
        "ok": {"type": "boolean"}, "kind": {"enum": ["a", "b", "c"]},
        "score": {"type": "number", "minimum": 0, "maximum": 1}},
     "required": ["ok", "kind", "score"], "additionalProperties": False},
    {"type": "object", "properties": {"tags": {
        "type": "array", "items": {"enum": ["x", "y", "z"]}, "minItems": 1, "maxItems": 4}},
     "required": ["tags"], "additionalProperties": False},
    {"type": "object", "properties": {"id": {"type": "string", "pattern": "^[a-z]{2,6}-[0-9]{3}$"},
                                      "note": {"type": "string", "maxLength": 8}},
     "required": ["id", "note"], "additionalProperties": False},
    {"type": "object", "properties": {"v": {"anyOf": [{"type": "integer", "maximum": 99},
                                                      {"type": "null"},
                                                      {"const": "none"}]}},
     "required": ["v"], "additionalProperties": False},
    {"type": "object", "properties": {"outer": {
        "type": "object", "properties": {"inner": {
            "type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
            "maxItems": 3}}, "required": ["inner"], "additionalProperties": False}},
     "required": ["outer"], "additionalProperties": False},
    {"type": "array", "items": {"type": "object", "properties": {
        "k": {"type": "string", "maxLength": 3}}, "required": ["k"],
        "additionalProperties": False}, "minItems": 2, "maxItems": 2},
    {"type": "object", "properties": {"mode": {"const": "fast"},
                                      "level": {"type": "integer", "enum": [1, 2, 3]}},
     "required": ["mode", "level"], "additionalProperties": False},
]


# A schema whose every document is short (booleans, enums, bounded integers and arrays, a string
# of at most 6 characters: under 150 bytes however written, escapes included): a token is at
# least a byte, so within max_tokens the grammar itself closes it, with no bias to help.
CLOSED = {"type": "object", "properties": {
    "ok": {"type": "boolean"}, "kind": {"enum": ["a", "b", "c"]},
    "n": {"type": "integer", "minimum": 0, "maximum": 99},
    "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 3},
    "name": {"type": "string", "maxLength": 6}},
    "required": ["ok", "kind", "n", "tags", "name"], "additionalProperties": False}
CLOSED_FORMAT = {"type": "json_schema", "json_schema": {"name": "closed", "schema": CLOSED,
                                                        "strict": True}}


class Agent:
    def __init__(self, d: Daemon, model: Path, call_ids: tuple[int, int]) -> None:
        self.d, self.model, self.call_ids = d, model, call_ids
        self.client = openai.OpenAI(base_url=d.api_url() + "/v1", api_key="x", max_retries=0,
                                    timeout=120)
        self.claude = anthropic.Anthropic(base_url=d.api_url(), api_key="x", max_retries=0,
                                          timeout=120)

    def chat(self, model: str = "tools", **kw: Any) -> Any:
        kw.setdefault("messages", HELLO)
        kw.setdefault("max_tokens", 160)
        return self.client.chat.completions.create(model=model, **kw)


@pytest.fixture(scope="module")
def agent(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    tmp = tmp_path_factory.mktemp("agent")
    tools_model = with_tool_template(tiny_model, tmp / "tools")
    caller, *call_ids = make_caller_model(tools_model, tmp / "caller")
    d = Daemon({"api": {"listen": "127.0.0.1:0"}, "instances": {
        "tools": {"model": str(tools_model), "max_concurrency": 4,
                  "grammar": {"max_schema_kib": 512, "max_size": 4000}},
        "plain": {"model": str(tiny_model)},
        "group": {"model": str(tools_model), "shards": 2, "max_concurrency": 2},
        "think": {"model": str(make_thinking_model(tiny_model, tmp / "think", tools=True)),
                  "max_concurrency": 2},
        "caller": {"model": str(caller)}}})
    try:
        d.start()
        d.watch_until(lambda s: all(i["state"] == "ready" for i in s["instances"]),
                      what="every instance ready")
        yield Agent(d, tools_model, (call_ids[0], call_ids[1]))
    finally:
        d.close()


def check_calls(choice: Any, allowed: set[str]) -> list[tuple[str, dict[str, Any]]]:
    assert choice.finish_reason == "tool_calls", choice
    calls = choice.message.tool_calls
    assert calls and choice.message.content is None
    out = []
    for c in calls:
        assert c.type == "function" and c.id.startswith("call_") and c.function.name in allowed
        args = json.loads(c.function.arguments)
        jsonschema.validate(args, PARAMS[c.function.name])
        out.append((c.function.name, args))
    return out


# ---- tools --------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(4))
def test_required_tool_choice_gives_valid_calls(agent: Agent, seed: int) -> None:
    r = agent.chat(tools=TOOLS, tool_choice="required", seed=seed, logit_bias=CLOSERS)
    check_calls(r.choices[0], {"get_weather", "add"})


@pytest.mark.parametrize("seed", range(3))
def test_named_tool_choice_calls_that_tool_once(agent: Agent, seed: int) -> None:
    r = agent.chat(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "add"}},
                   parallel_tool_calls=False, seed=seed, temperature=1.0)
    assert [name for name, _ in check_calls(r.choices[0], {"add"})] == ["add"]


def test_streamed_tool_call_deltas_reassemble(agent: Agent) -> None:
    kw: dict[str, Any] = {"tools": TOOLS, "tool_choice": "required", "seed": 11,
                          "logit_bias": CLOSERS}
    whole = agent.chat(**kw).choices[0]
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    first_of: dict[int, Any] = {}
    for chunk in agent.chat(stream=True, **kw):
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        for d in choice.delta.tool_calls or []:
            if d.index not in first_of:
                first_of[d.index] = d  # the id and the name come first
                calls[d.index] = {"id": d.id, "name": d.function.name, "arguments": ""}
            calls[d.index]["arguments"] += d.function.arguments or ""
    assert finish == "tool_calls"
    assert all(d.id and d.function.name for d in first_of.values())
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
        (c.function.name, json.loads(c.function.arguments)) for c in whole.message.tool_calls]


def test_a_tool_round_trip_reaches_the_prompt(agent: Agent) -> None:
    from transformers import AutoTokenizer

    result = "RESULT-7781 sunny and 21 degrees"
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function", "function": {
                "name": "get_weather", "arguments": '{"city": "Oslo", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": result}]
    r = agent.chat(messages=messages, tools=TOOLS, max_tokens=1, temperature=0)
    tok = AutoTokenizer.from_pretrained(agent.model)
    templated = [dict(m) for m in messages]
    templated[1] = {**messages[1], "content": "", "tool_calls": [{
        "id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}}]}
    text = tok.apply_chat_template(templated, tools=TOOLS, add_generation_prompt=True,
                                   tokenize=False)
    assert result in text and '"name": "get_weather"' in text and '"city": "Oslo"' in text
    assert r.usage.prompt_tokens == len(tok(text, add_special_tokens=False)["input_ids"])


# ---- tool_choice auto: mlx-lm's parser on a real runner ------------------------------------------
def test_auto_returns_a_call_the_model_wrote(agent: Agent) -> None:
    """The caller model writes the call it is steered to (a bias, not a grammar): mlx-lm's
    json_tools parser reads it, whole and streamed."""
    kw: dict[str, Any] = {"model": "caller", "tools": TOOLS, "max_tokens": 8, "temperature": 0,
                          "parallel_tool_calls": False,
                          "logit_bias": {str(agent.call_ids[0]): 100}}
    choice = agent.chat(**kw).choices[0]
    assert check_calls(choice, {"add"}) == [("add", {"a": 1, "b": 2})]
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in agent.chat(stream=True, **kw):
        finish = chunk.choices[0].finish_reason or finish
        assert not chunk.choices[0].delta.content
        for d in chunk.choices[0].delta.tool_calls or []:
            call = calls.setdefault(d.index, {"id": d.id or "", "name": d.function.name or "",
                                              "arguments": ""})
            call["arguments"] += d.function.arguments or ""
    assert finish == "tool_calls"
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
        ("add", {"a": 1, "b": 2})] and calls[0]["id"].startswith("call_")


def test_auto_drops_a_call_that_does_not_parse_never_showing_its_markup(agent: Agent) -> None:
    """The caller model's broken call (cut by max_tokens): neither a call nor text; the runner
    logs it."""
    kw: dict[str, Any] = {"model": "caller", "tools": TOOLS, "max_tokens": 1, "temperature": 0,
                          "logit_bias": {str(agent.call_ids[1]): 100}}
    choice = agent.chat(**kw).choices[0]
    assert not choice.message.content and choice.message.tool_calls is None
    assert choice.finish_reason == "length"
    chunks = [c.choices[0].delta for c in agent.chat(stream=True, **kw) if c.choices]
    assert "".join(d.content or "" for d in chunks) == ""
    assert not any(d.tool_calls for d in chunks)
    assert "a tool call was dropped" in agent.d.log_text()  # the runner logs it


def test_a_model_without_tool_support_refuses_tools(agent: Agent) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        agent.chat(model="plain", tools=TOOLS)
    assert e.value.status_code == 400 and e.value.body["param"] == "tools"  # type: ignore


# ---- constrained decoding ---------------------------------------------------------------------
@pytest.mark.parametrize("i", range(len(SCHEMAS)))
def test_json_schema_output_validates(agent: Agent, i: int) -> None:
    for seed in range(3):
        r = agent.chat(seed=seed, max_tokens=200, logit_bias=CLOSERS, response_format={
            "type": "json_schema", "json_schema": {"name": f"s{i}", "schema": SCHEMAS[i],
                                                   "strict": True}})
        assert r.choices[0].finish_reason == "stop", r
        jsonschema.validate(json.loads(r.choices[0].message.content or ""), SCHEMAS[i])


def test_json_object_output_is_an_object(agent: Agent) -> None:
    for seed in range(3):
        r = agent.chat(seed=seed, max_tokens=300, logit_bias=CLOSERS,
                       response_format={"type": "json_object"})
        assert r.choices[0].finish_reason == "stop", r
        assert isinstance(json.loads(r.choices[0].message.content or ""), dict)


def test_the_grammar_alone_closes_a_short_schema(agent: Agent) -> None:
    """No bias: every document of CLOSED fits in max_tokens, so every try ends valid."""
    for seed in range(4):
        r = agent.chat(seed=seed, max_tokens=200, response_format=CLOSED_FORMAT)
        assert r.choices[0].finish_reason == "stop", r
        jsonschema.validate(json.loads(r.choices[0].message.content or ""), CLOSED)


# ---- a thinking model: reasoning, then the answer the grammar wants -----------------------------
def test_a_thinking_model_thinks_then_answers_in_the_schema(agent: Agent) -> None:
    """The template opens a think block: the random model thinks (at most half of max_tokens),
    the grammar makes it close the block, and the JSON is the content, valid on every try."""
    for seed in range(3):
        r = agent.chat(model="think", seed=seed, max_tokens=400, response_format=CLOSED_FORMAT)
        message = r.choices[0].message
        assert r.choices[0].finish_reason == "stop", r
        jsonschema.validate(json.loads(message.content or ""), CLOSED)
        assert message.reasoning_content  # type: ignore[attr-defined]
    streamed = list(agent.chat(model="think", seed=0, max_tokens=400, stream=True,
                               response_format=CLOSED_FORMAT))
    deltas = [c.choices[0].delta for c in streamed if c.choices]
    whole = agent.chat(model="think", seed=0, max_tokens=400, response_format=CLOSED_FORMAT)
    assert "".join(d.content or "" for d in deltas) == whole.choices[0].message.content
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == \
        whole.choices[0].message.reasoning_content  # type: ignore[attr-defined]


def test_a_thinking_model_budget_leaves_room_for_the_answer(agent: Agent) -> None:
    """A random model never closes its block on its own: the bound does, at half of
    max_tokens, and the answer follows (cut at max_tokens, as anywhere, if it is longer)."""
    r = agent.chat(model="think", seed=1, max_tokens=40, logit_bias=CLOSERS,
                   response_format={"type": "json_object"})
    assert r.usage.completion_tokens <= 40
    assert (r.choices[0].message.content or "").startswith("{")
    r = agent.chat(model="think", seed=1, max_tokens=300, logit_bias=CLOSERS,
                   response_format={"type": "json_object"})
    assert r.choices[0].finish_reason == "stop", r
    assert isinstance(json.loads(r.choices[0].message.content or ""), dict)


def test_a_thinking_model_thinks_then_calls_the_tool(agent: Agent) -> None:
    for seed in range(2):
        r = agent.chat(model="think", seed=seed, max_tokens=400, tools=TOOLS,
                       parallel_tool_calls=False,
                       tool_choice={"type": "function", "function": {"name": "get_weather"}})
        assert check_calls(r.choices[0], {"get_weather"})
        assert r.choices[0].message.reasoning_content  # type: ignore[attr-defined]


def test_a_thinking_model_with_thinking_off_answers_at_once(agent: Agent) -> None:
    r = agent.chat(model="think", seed=0, max_tokens=200, response_format=CLOSED_FORMAT,
                   extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert getattr(r.choices[0].message, "reasoning_content", None) is None
    jsonschema.validate(json.loads(r.choices[0].message.content or ""), CLOSED)
    assert r.usage.completion_tokens < 150


def test_a_batch_mixing_constrained_and_free_gives_each_its_solo_tokens(agent: Agent) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMAS[1]}}
    reqs: list[dict[str, Any]] = [
        {"seed": 1, "response_format": fmt, "logit_bias": CLOSERS},
        {"seed": 2, "max_tokens": 24},
        {"seed": 3, "tools": TOOLS, "tool_choice": "required", "logit_bias": CLOSERS},
        {"temperature": 0, "max_tokens": 24},
    ]

    def answer(kw: dict[str, Any]) -> Any:
        msg = agent.chat(**kw).choices[0].message
        return msg.content, [(c.function.name, c.function.arguments)
                             for c in msg.tool_calls or []]

    solo = [answer(kw) for kw in reqs]
    together: list[Any] = [None] * len(reqs)
    threads = [threading.Thread(target=lambda i=i: together.__setitem__(i, answer(reqs[i])))
               for i in range(len(reqs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert together == solo


def test_a_two_rank_group_enforces_the_grammar(agent: Agent) -> None:
    for seed in range(2):
        r = agent.chat(model="group", tools=TOOLS, tool_choice="required", seed=seed,
                       logit_bias=CLOSERS)
        check_calls(r.choices[0], {"get_weather", "add"})
        r = agent.chat(model="group", seed=seed, logit_bias=CLOSERS, response_format={
            "type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMAS[2]}})
        jsonschema.validate(json.loads(r.choices[0].message.content or ""), SCHEMAS[2])
    same = {"tools": TOOLS, "tool_choice": "required", "seed": 5, "logit_bias": CLOSERS}
    assert agent.chat(model="group", **same).choices[0].message.tool_calls[0].function == \
        agent.chat(**same).choices[0].message.tool_calls[0].function


# ---- schemas made by agent libraries: valid on every try, in every dialect --------------------
LIBRARY = small_schemas()  # each fits in 200 tokens however written (tests.library_schemas)
SEEDS = 6


def every(jobs: list[Any], one: Callable[[Any], None]) -> None:
    """`one(job)` for each job, four at a time (the instance's max_concurrency)."""
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, jobs))


def _library_format(schema: dict[str, Any], strict: bool) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "s", "schema": schema,
                                                   "strict": strict}}


def test_library_schemas_are_valid_on_every_try(agent: Agent) -> None:
    """No logit bias: the random model writes whatever the grammar lets it, sampled. Without
    the bounds it wrote keys the schemas never named, or numbers of hundreds of digits, until
    max_tokens cut the JSON."""
    def one(job: tuple[str, dict[str, Any], bool, int]) -> None:
        what, schema, strict, seed = job
        r = agent.chat(seed=seed, max_tokens=200,
                       response_format=_library_format(schema, strict))
        assert r.choices[0].finish_reason == "stop", (what, seed, r)
        jsonschema.validate(json.loads(r.choices[0].message.content or ""), schema)

    every([(*s, seed) for s in LIBRARY for seed in range(SEEDS)], one)


def test_forced_calls_of_library_tools_are_valid(agent: Agent) -> None:
    """The same schemas as tools' parameters, forced (required: any of them; named: each)."""
    tools = [{"type": "function", "function": {"name": what.replace(" ", "_"),
                                               "parameters": schema, "strict": strict}}
             for what, schema, strict in LIBRARY]
    params = {t["function"]["name"]: t["function"]["parameters"] for t in tools}

    def one(choice: Any) -> None:
        seed, name = choice
        forced: Any = "required" if name is None else {"type": "function",
                                                       "function": {"name": name}}
        r = agent.chat(seed=seed, max_tokens=200, tools=tools, tool_choice=forced,
                       parallel_tool_calls=False)
        (call,) = r.choices[0].message.tool_calls or [None]
        assert call is not None and name in (None, call.function.name), r
        jsonschema.validate(json.loads(call.function.arguments), params[call.function.name])

    every([(seed, None) for seed in range(SEEDS)] + [(0, n) for n in params], one)


def test_a_strict_auto_call_with_a_key_the_schema_does_not_name_is_dropped(
        agent: Agent) -> None:
    """The caller model writes add(a=1, b=2). A strict tool that names only `a` does not allow
    `b` (no additionalProperties means none, as when the call is forced): the call is dropped,
    never shown as text."""
    def add(properties: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"type": "function", "function": {"name": "add", "strict": True, "parameters": {
            "type": "object", "properties": properties}}}]

    kw: dict[str, Any] = {"model": "caller", "max_tokens": 1, "temperature": 0,
                          "logit_bias": {str(agent.call_ids[0]): 100}}
    both = agent.chat(tools=add({"a": {"type": "integer"}, "b": {"type": "integer"}}), **kw)
    assert [c.function.arguments for c in both.choices[0].message.tool_calls or []] == [
        '{"a": 1, "b": 2}']
    one = agent.chat(tools=add({"a": {"type": "integer"}}), **kw).choices[0]
    assert one.message.tool_calls is None and not one.message.content


# These dialects take no seed: each try is sampled afresh (temperature 1).
def test_anthropic_output_format_and_forced_tools_on_library_schemas(agent: Agent) -> None:
    def one(job: tuple[str, dict[str, Any], int]) -> None:
        what, schema, _ = job
        r = agent.claude.messages.create(
            model="tools", max_tokens=200, messages=[{"role": "user", "content": "hello"}],
            output_config={"format": {"type": "json_schema", "schema": schema}})
        assert r.stop_reason == "end_turn", (what, r)
        jsonschema.validate(json.loads(r.content[0].text), schema)  # type: ignore[union-attr]
        tools: Any = [{"name": "t", "input_schema": schema}]
        r = agent.claude.messages.create(
            model="tools", max_tokens=200, messages=[{"role": "user", "content": "hello"}],
            tools=tools, tool_choice={"type": "tool", "name": "t",
                                      "disable_parallel_tool_use": True})
        (call,) = [b for b in r.content if b.type == "tool_use"]
        jsonschema.validate(call.input, schema)

    every([(w, s, seed) for w, s, _ in LIBRARY for seed in range(2)], one)


def test_responses_text_format_and_forced_tools_on_library_schemas(agent: Agent) -> None:
    def one(job: tuple[str, dict[str, Any], bool, int]) -> None:
        what, schema, strict, _ = job
        r = agent.client.responses.create(
            model="tools", input="hello", max_output_tokens=200,
            text={"format": {"type": "json_schema", "name": "s", "schema": schema,
                             "strict": strict}})
        assert r.status == "completed", (what, r)
        jsonschema.validate(json.loads(r.output_text), schema)
        tool: Any = {"type": "function", "name": "t", "parameters": schema, "strict": strict}
        r = agent.client.responses.create(
            model="tools", input="hello", max_output_tokens=200, tools=[tool],
            tool_choice="required", parallel_tool_calls=False)
        (call,) = [i for i in r.output if i.type == "function_call"]
        jsonschema.validate(json.loads(call.arguments), schema)

    every([(*s, seed) for s in LIBRARY for seed in range(2)], one)


# ---- hostile input ------------------------------------------------------------------------------
def deep(n: int) -> dict[str, Any]:
    s: dict[str, Any] = {"type": "string"}
    for _ in range(n):
        s = {"type": "object", "properties": {"a": s}, "required": ["a"]}
    return s


def _schema_format(schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "h", "schema": schema,
                                                   "strict": True}}


HOSTILE: list[tuple[str, dict[str, Any], str]] = [
    ("nested 300 deep", {"response_format": _schema_format(deep(300))},
     "response_format.json_schema.schema"),
    ("enum of 50,000", {"response_format": _schema_format(
        {"enum": [f"value-{i}" for i in range(50_000)]})}, "response_format"),  # max_schema_kib
    ("anyOf of 3000 objects", {"response_format": _schema_format({"anyOf": [
        {"type": "object", "properties": {f"k{i}": {"type": "integer"}, "n": {"const": i}},
         "required": [f"k{i}", "n"], "additionalProperties": False} for i in range(3000)]})},
     "response_format.json_schema.schema"),  # past the engine's max_size
    ("lookahead regex", {"response_format": _schema_format(
        {"type": "string", "pattern": "^(?=a)b$"})}, "response_format.json_schema.schema"),
    ("a keyword the engine lacks, strict", {"response_format": _schema_format(
        {"type": "array", "uniqueItems": True})},
     "response_format.json_schema.schema"),
    ("3000 tools", {"tools": [{"type": "function", "function": {"name": f"t{i}"}}
                              for i in range(3000)]}, "tools"),
    ("a named tool not in the list", {"tools": TOOLS, "tool_choice": {
        "type": "function", "function": {"name": "launch"}}}, "tool_choice"),
    ("a past call's arguments not JSON", {"messages": [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function",
         "function": {"name": "add", "arguments": "{" * 100_000}}]}]},
     "messages[0].tool_calls[0].function.arguments"),
    ("tool_choice required with no tools", {"tool_choice": "required"}, "tool_choice"),
    ("a strict tool with a keyword the engine lacks", {"tools": [{"type": "function", "function": {
        "name": "t", "strict": True, "parameters": {"type": "array", "uniqueItems": True}}}]},
     "tools[0].function.parameters"),
    ("a strict tool with a lookahead regex", {"tools": [TOOLS[0], {"type": "function",
        "function": {"name": "t", "strict": True, "parameters": {
            "type": "object", "properties": {"s": {"type": "string", "pattern": "^(?=a)b$"}}}}}],
        "tool_choice": "required"}, "tools[1].function.parameters"),
    ("response_format of an unknown type", {"response_format": {"type": "yaml"}},
     "response_format"),
]


@pytest.mark.parametrize("body, param", [(b, p) for _, b, p in HOSTILE],
                         ids=[n for n, _, _ in HOSTILE])
def test_hostile_agent_fields_get_a_4xx_within_seconds(agent: Agent, body: dict[str, Any],
                                                       param: str) -> None:
    started = time.monotonic()
    with pytest.raises(openai.BadRequestError) as e:
        agent.chat(**body)
    assert time.monotonic() - started < 10
    assert e.value.status_code == 400 and e.value.body["param"] == param  # type: ignore


def test_a_schema_refused_for_its_size_does_not_slow_a_running_stream(agent: Agent) -> None:
    """Schemas past the engine's bounds, sent again and again while a stream runs on the same
    instance, are refused within seconds each, and the stream's tokens keep coming meanwhile:
    the compile runs off the thread that steps the batch (a generous bound on the gaps)."""
    hostile = [body for name, body, _ in HOSTILE
               if name in ("nested 300 deep", "anyOf of 3000 objects", "enum of 50,000")]
    arrivals: list[float] = []
    refusals: list[tuple[float, float]] = []
    started = threading.Event()

    def stream() -> None:
        for _ in agent.chat(stream=True, max_tokens=600, temperature=1.0, seed=3,
                            logit_bias={"2": -100}):
            arrivals.append(time.monotonic())
            if len(arrivals) == 5:
                started.set()
        started.set()

    runner = threading.Thread(target=stream)
    runner.start()
    assert started.wait(60)
    while runner.is_alive() and len(refusals) < 30:
        begun = time.monotonic()
        with pytest.raises(openai.BadRequestError):
            agent.chat(**hostile[len(refusals) % len(hostile)])
        refusals.append((begun, time.monotonic()))
    runner.join()
    assert refusals and max(end - begun for begun, end in refusals) < 10
    during = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)
              if refusals[0][0] <= b <= refusals[-1][1]]
    assert during, "the stream ended before the refusals began"
    assert max(during) < 1.5, sorted(during)[-5:]


def test_pathological_regexes_are_enforced_not_feared(agent: Agent) -> None:
    for pattern in ("^(a+)+$", "^(a|aa)*b?$", "^([a-z]+.)+[A-Z]$"):
        schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": pattern,
                                                         "maxLength": 12}},
                  "required": ["s"], "additionalProperties": False}
        r = agent.chat(seed=1, logit_bias=CLOSERS, response_format=_schema_format(schema))
        jsonschema.validate(json.loads(r.choices[0].message.content or ""), schema)


def test_strict_decides_whether_a_keyword_the_engine_lacks_is_refused_or_left_out(
        agent: Agent) -> None:
    """As response_format's `strict`: a strict tool's parameters must be enforceable whole
    (else 400, whatever tool_choice is); a tool not strict gets the rest of them enforced."""
    tags = {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 2}
    params = {"type": "object", "properties": {"tags": {**tags, "uniqueItems": True}},
              "required": ["tags"], "additionalProperties": False}
    tool: dict[str, Any] = {"type": "function", "function": {"name": "tag", "parameters": params}}
    r = agent.chat(tools=[tool], tool_choice="required", parallel_tool_calls=False, seed=0,
                   logit_bias=CLOSERS)
    (call,) = r.choices[0].message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), {**params, "properties": {
        "tags": tags}})
    strict = {**tool, "function": {**tool["function"], "strict": True}}
    for choice in ("auto", "required"):
        with pytest.raises(openai.BadRequestError) as e:
            agent.chat(tools=[strict], tool_choice=choice)
        assert e.value.body["param"] == "tools[0].function.parameters"  # type: ignore[index]


def test_huge_arguments_in_a_past_call_are_served(agent: Agent) -> None:
    args = json.dumps({"city": "x " * 4_000, "unit": "celsius"})
    r = agent.chat(max_tokens=1, messages=[
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function",
         "function": {"name": "get_weather", "arguments": args}}]},
        {"role": "tool", "tool_call_id": "c", "content": "done"}], tools=TOOLS)
    assert r.usage.prompt_tokens > 4_000
