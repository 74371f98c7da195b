"""The Anthropic Messages and OpenAI Responses dialects end to end, driven by the official
`anthropic` and `openai` clients against a real daemon and runners of the tiny model. Their
answers are compared with chat completions' for the same conversation (the core both adapt),
and their streams with their own whole answers. One daemon serves the module: tests only read.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anthropic
import jsonschema
import openai
import pytest

from tests.harness import ONE_PIXEL_PNG, Daemon
from tests.integration.test_agent_tools import SCHEMAS, WEATHER
from tests.models.thinking import make_thinking_model
from tests.models.tiny import with_tool_template
from tests.usage import prompt_of
from tests.integration.test_api import TOKEN, Served, sse_events  # noqa: F401

ASK = "hello there"


class Both(Served):
    def __init__(self, daemon: Daemon, model: Path) -> None:
        super().__init__(daemon, model)
        self.claude = anthropic.Anthropic(base_url=self.url, api_key=TOKEN, max_retries=0,
                                          timeout=60)

    def chat(self, n: int, messages: list[dict[str, Any]] | None = None,
             **kw: Any) -> openai.types.chat.ChatCompletion:
        return self.client.chat.completions.create(
            model="tiny", messages=messages or [{"role": "user", "content": ASK}],  # type: ignore[arg-type]
            max_tokens=n, temperature=0, **kw)

    def sse(self, path: str, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """(event name, data) of every event of a raw SSE answer, checking the framing."""
        resp, raw = self.raw("POST", path, body)
        assert resp.status == 200, raw
        out = []
        for block in raw[:-2].split(b"\n\n"):
            name, data = block.split(b"\n")
            assert name.startswith(b"event: ") and data.startswith(b"data: "), block
            payload = json.loads(data[len(b"data: "):])
            assert payload["type"] == name[len(b"event: "):].decode()
            out.append((payload["type"], payload))
        return out


@pytest.fixture(scope="module")
def both(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Both]:
    tmp = tmp_path_factory.mktemp("dialects")
    token_file = tmp / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)  # a secret: closed to other users
    tools_model = with_tool_template(tiny_model, tmp / "tools")
    think_model = make_thinking_model(tiny_model, tmp / "think")
    # `spare` is there to be filled (429), then stopped (an error mid-stream, then 529).
    d = Daemon({"api": {"listen": "127.0.0.1:0", "token_file": str(token_file)},
                "instances": {"tiny": {"model": str(tiny_model), "max_concurrency": 1},
                              "tools": {"model": str(tools_model), "max_concurrency": 1},
                              "think": {"model": str(think_model), "max_concurrency": 1},
                              "spare": {"model": str(tiny_model), "max_concurrency": 2,
                                        "max_queue": 0,
                                        "stop": {"grace": "60s", "drain": "1s"}}}})
    try:
        d.start()
        d.watch_until(lambda s: all(i["state"] == "ready" for i in s["instances"]),
                      what="every instance ready")
        yield Both(d, tiny_model)
    finally:
        d.close()


# ---- Anthropic Messages ---------------------------------------------------------------------
def test_messages_create_gives_chat_completions_greedy_answer(both: Both) -> None:
    r = both.claude.messages.create(model="tiny", max_tokens=12,
                                    messages=[{"role": "user", "content": ASK}],
                                    extra_body={"temperature": 0})
    assert r.type == "message" and r.role == "assistant" and r.model == "tiny"
    assert r.id.startswith("msg_")
    text = "".join(b.text for b in r.content if b.type == "text")
    plain = both.chat(12)
    assert text == (plain.choices[0].message.content or "")
    assert prompt_of(r.usage) == plain.usage.prompt_tokens  # type: ignore[union-attr]
    assert r.usage.output_tokens == plain.usage.completion_tokens  # type: ignore[union-attr]
    assert r.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[
        plain.choices[0].finish_reason]


def test_sampling_fields_are_honoured_plainly_and_through_extra_body(both: Both) -> None:
    """The current SDK no longer types temperature/top_p/top_k: clients send them through
    extra_body, older clients plainly; both reach the sampler (temperature 0 = greedy)."""
    greedy = both.chat(16).choices[0].message.content
    resp, raw = both.raw("POST", "/v1/messages", {
        "model": "tiny", "max_tokens": 16, "temperature": 0,
        "messages": [{"role": "user", "content": ASK}]})
    assert resp.status == 200, raw
    assert json.loads(raw)["content"][0]["text"] == greedy
    r = both.claude.messages.create(model="tiny", max_tokens=16, extra_body={"temperature": 0},
                                    messages=[{"role": "user", "content": ASK}])
    assert r.content[0].text == greedy  # type: ignore[union-attr]
    resp, raw = both.raw("POST", "/v1/messages", {
        "model": "tiny", "max_tokens": 16, "temperature": 7,
        "messages": [{"role": "user", "content": ASK}]})
    assert resp.status == 400 and json.loads(raw)["error"]["type"] == "invalid_request_error"


def test_messages_stream_reassembles_to_the_whole_answer(both: Both) -> None:
    whole = both.claude.messages.create(model="tiny", max_tokens=20, system="Be brief.",
                                        extra_body={"temperature": 0},
                                        messages=[{"role": "user", "content": ASK}])
    with both.claude.messages.stream(model="tiny", max_tokens=20, system="Be brief.",
                                     extra_body={"temperature": 0},
                                     messages=[{"role": "user", "content": ASK}]) as s:
        pieces = list(s.text_stream)
        final = s.get_final_message()
    assert "".join(pieces) == whole.content[0].text  # type: ignore[union-attr]
    assert final.content[0].text == whole.content[0].text  # type: ignore[union-attr]
    assert final.stop_reason == whole.stop_reason
    assert prompt_of(final.usage) == prompt_of(whole.usage)
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_messages_stream_events_come_in_anthropic_order(both: Both) -> None:
    events = both.sse("/v1/messages", {"model": "tiny", "max_tokens": 8, "stream": True,
                                       "temperature": 0,
                                       "messages": [{"role": "user", "content": ASK}]})
    names = [n for n, _ in events]
    assert names[:2] == ["message_start", "ping"]
    assert names[2] == "content_block_start" and names[-3:] == [
        "content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    delta = events[-2][1]
    whole = both.chat(8)
    assert delta["delta"]["stop_reason"] == {"length": "max_tokens", "stop": "end_turn"}[
        whole.choices[0].finish_reason]
    assert delta["usage"]["output_tokens"] == whole.usage.completion_tokens  # type: ignore[union-attr]
    assert delta["usage"]["input_tokens"] > 0


def test_a_stop_sequence_is_named(both: Both) -> None:
    text = both.chat(24).choices[0].message.content or ""
    stop = text[5:8]
    assert len(stop) == 3, text
    r = both.claude.messages.create(model="tiny", max_tokens=24, stop_sequences=[stop, "\x00"],
                                    extra_body={"temperature": 0},
                                    messages=[{"role": "user", "content": ASK}])
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == stop
    assert r.content[0].text == text[:text.index(stop)]  # type: ignore[union-attr]


def test_count_tokens_is_the_prompt_length_after_the_template(both: Both) -> None:
    convo: list[Any] = [{"role": "user", "content": ASK},
                        {"role": "assistant", "content": "hi"},
                        {"role": "user", "content": [{"type": "text", "text": "again"}]}]
    counted = both.claude.messages.count_tokens(model="tiny", system="Be brief.",
                                                messages=convo)
    chat = both.chat(1, [{"role": "system", "content": "Be brief."}, *convo[:2],
                         {"role": "user", "content": "again"}])
    assert counted.input_tokens == chat.usage.prompt_tokens  # type: ignore[union-attr]


def test_messages_errors_are_in_anthropic_shape(both: Both) -> None:
    with pytest.raises(anthropic.NotFoundError) as nf:
        both.claude.messages.create(model="nope", max_tokens=4,
                                    messages=[{"role": "user", "content": ASK}])
    assert nf.value.body["type"] == "error"  # type: ignore[index]
    assert nf.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    bad = anthropic.Anthropic(base_url=both.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as au:
        bad.messages.create(model="tiny", max_tokens=4,
                            messages=[{"role": "user", "content": ASK}])
    assert au.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    for body, param in [({"messages": [{"role": "user", "content": ASK}]}, "max_tokens"),
                        ({"max_tokens": 4, "messages": [{"role": "user", "content": [
                            {"type": "image", "source": {
                                "type": "base64", "media_type": "image/png",
                                "data": ONE_PIXEL_PNG}}]}]}, "messages[0].content[0]"),
                        ({"max_tokens": 4, "container": "x",
                          "messages": [{"role": "user", "content": ASK}]}, "container")]:
        resp, raw = both.raw("POST", "/v1/messages", {"model": "tiny", **body})
        err = json.loads(raw)
        assert resp.status == 400 and err["type"] == "error", raw
        assert err["error"]["type"] == "invalid_request_error" and param in err["error"][
            "message"], (param, err)
    resp, raw = both.raw("POST", "/v1/messages/nope", {})
    assert resp.status == 404 and json.loads(raw)["error"]["type"] == "not_found_error"


def test_x_api_key_and_bearer_are_the_same_token(both: Both) -> None:
    ok = anthropic.Anthropic(base_url=both.url, auth_token=TOKEN, max_retries=0)  # Bearer
    assert ok.messages.create(model="tiny", max_tokens=2, messages=[
        {"role": "user", "content": ASK}]).type == "message"
    resp, raw = both.raw("GET", "/v1/models", token=None)
    assert resp.status == 401


def test_models_list_reads_in_both_clients(both: Both) -> None:
    (m,) = [m for m in both.client.models.list().data if m.id == "tiny"]
    assert m.model_extra["state"] == "ready"  # type: ignore[index]
    assert m.model_extra["context_length"] > 0  # type: ignore[index]
    (a,) = [a for a in both.claude.models.list().data if a.id == "tiny"]
    assert a.type == "model" and a.display_name == "tiny"


# ---- OpenAI Responses -----------------------------------------------------------------------
def test_responses_create_gives_chat_completions_greedy_answer(both: Both) -> None:
    plain = both.chat(12, [{"role": "system", "content": "Be brief."},
                           {"role": "user", "content": ASK}])
    r = both.client.responses.create(model="tiny", instructions="Be brief.", input=ASK,
                                     max_output_tokens=12, temperature=0, store=False)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == "tiny"
    assert r.output_text == plain.choices[0].message.content
    assert r.usage is not None
    assert r.usage.input_tokens == plain.usage.prompt_tokens  # type: ignore[union-attr]
    assert r.usage.output_tokens == plain.usage.completion_tokens  # type: ignore[union-attr]
    done = plain.choices[0].finish_reason
    assert r.status == ("incomplete" if done == "length" else "completed")


def test_responses_items_carry_the_conversation(both: Both) -> None:
    items: list[Any] = [{"role": "user", "content": [{"type": "input_text", "text": ASK}]},
                        {"type": "message", "role": "assistant",
                         "content": [{"type": "output_text", "text": "hi"}]},
                        {"role": "user", "content": "again"}]
    r = both.client.responses.create(model="tiny", input=items, max_output_tokens=8,
                                     temperature=0)
    plain = both.chat(8, [{"role": "user", "content": ASK},
                          {"role": "assistant", "content": "hi"},
                          {"role": "user", "content": "again"}])
    assert r.output_text == plain.choices[0].message.content


def test_responses_stream_events_in_order_and_reassembled(both: Both) -> None:
    whole = both.client.responses.create(model="tiny", input=ASK, max_output_tokens=10,
                                         temperature=0)
    stream = both.client.responses.create(model="tiny", input=ASK, max_output_tokens=10,
                                          temperature=0, stream=True)
    events = list(stream)
    names = [e.type for e in events]
    assert names[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert names[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done",
                          "response.incomplete" if whole.status == "incomplete"
                          else "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text
    last = events[-1].response  # type: ignore[union-attr]
    assert last.output_text == whole.output_text
    assert last.usage.output_tokens == whole.usage.output_tokens  # type: ignore[union-attr]
    with both.client.responses.stream(model="tiny", input=ASK, max_output_tokens=10,
                                      temperature=0) as s:  # the SDK's own accumulator
        *_, end = list(s)
    # Cut short by max_output_tokens, as OpenAI does: response.incomplete, whose response the
    # SDK fills with the items it accumulated.
    assert end.type == names[-1]
    assert end.response.output_text == whole.output_text  # type: ignore[union-attr]


def test_responses_refuses_what_a_stateless_server_cannot_do(both: Both) -> None:
    for kw, param in [({"store": True}, "store"),
                      ({"previous_response_id": "resp_1"}, "previous_response_id"),
                      ({"truncation": "auto"}, "truncation")]:
        with pytest.raises(openai.BadRequestError) as e:
            both.client.responses.create(model="tiny", input=ASK, **kw)
        assert e.value.status_code == 400
        assert e.value.body["param"] == param, (kw, e.value.body)  # type: ignore[index]


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/responses"])
def test_a_client_that_leaves_mid_stream_frees_the_runner(both: Both, path: str) -> None:
    """The dialects share the chat path's cancellation: the runner drops the generation."""
    window = both.client.models.retrieve("tiny").model_extra["context_length"]  # type: ignore[index]
    body: dict[str, Any] = {"model": "tiny", "temperature": 0, "stream": True}
    if path == "/v1/messages":  # greedy never meets the tiny model's end token this soon
        body.update(max_tokens=window - 64, messages=[{"role": "user", "content": ASK}])
    else:
        body.update(max_output_tokens=window - 64, input=ASK)
    parts = urlsplit(both.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json",
                                                  "Authorization": f"Bearer {TOKEN}"})
    resp = conn.getresponse()
    assert resp.status == 200
    seen = b""
    while b"_delta" not in seen and b"text.delta" not in seen:  # text: the generation runs
        piece = resp.read1(4096)
        assert piece, seen  # the stream must not end: it runs for the whole window
        seen += piece
    both.d.until_instance("tiny", lambda i: i["ranks"][0]["status"] == "serving 1 request(s)")
    conn.close()
    both.d.until_instance("tiny", lambda i: i["ranks"][0]["status"] == "ready", timeout=30,
                          what="the runner to cancel the generation")


# ---- tools and structured output through both dialects ----------------------------------------
WEATHER_TOOL: dict[str, Any] = {"name": "get_weather", "description": "Weather",
                                "input_schema": WEATHER}


def test_messages_forced_tool_use_validates_streams_and_round_trips(both: Both) -> None:
    ask: Any = [{"role": "user", "content": ASK}]
    kw: Any = {"model": "tools", "max_tokens": 160, "tools": [WEATHER_TOOL],
               "tool_choice": {"type": "tool", "name": "get_weather",
                               "disable_parallel_tool_use": True},
               "extra_body": {"temperature": 0}}
    r = both.claude.messages.create(messages=ask, **kw)
    assert r.stop_reason == "tool_use", r
    (call,) = [b for b in r.content if b.type == "tool_use"]
    assert call.name == "get_weather" and call.id
    jsonschema.validate(call.input, WEATHER)
    with both.claude.messages.stream(messages=ask, **kw) as s:
        kinds = [e.delta.type for e in s if e.type == "content_block_delta"]
        final = s.get_final_message()
    assert set(kinds) == {"input_json_delta"}
    (streamed,) = [b for b in final.content if b.type == "tool_use"]
    assert streamed.input == call.input and final.stop_reason == "tool_use"
    # `any` is OpenAI's `required`: some tool is called.
    anyone = both.claude.messages.create(messages=ask, **{**kw, "tool_choice": {
        "type": "any", "disable_parallel_tool_use": True}})
    assert [b.name for b in anyone.content if b.type == "tool_use"] == ["get_weather"]

    def turn(result: str) -> list[Any]:
        return [*ask, {"role": "assistant", "content": [
            {"type": "tool_use", "id": call.id, "name": call.name, "input": call.input}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                          "content": result}]}]
    short = both.claude.messages.count_tokens(model="tools", messages=turn("sunny"),
                                              tools=[WEATHER_TOOL])
    long = both.claude.messages.count_tokens(model="tools", messages=turn("sunny " * 40),
                                             tools=[WEATHER_TOOL])
    assert long.input_tokens > short.input_tokens + 30  # the result reaches the template
    after = both.claude.messages.create(model="tools", max_tokens=8, messages=turn("sunny"),
                                        tools=[WEATHER_TOOL], extra_body={"temperature": 0})
    assert prompt_of(after.usage) == short.input_tokens


def test_messages_output_format_is_enforced(both: Both) -> None:
    schema = SCHEMAS[1]
    r = both.claude.messages.create(
        model="tiny", max_tokens=120, messages=[{"role": "user", "content": ASK}],
        output_config={"format": {"type": "json_schema", "schema": schema}},
        extra_body={"temperature": 0})
    jsonschema.validate(json.loads(r.content[0].text), schema)  # type: ignore[union-attr]


def test_responses_function_calls_and_text_format(both: Both) -> None:
    tool: Any = {"type": "function", "name": "get_weather", "parameters": WEATHER}
    kw: Any = {"model": "tools", "input": ASK, "tools": [tool], "tool_choice": "required",
               "parallel_tool_calls": False, "max_output_tokens": 160, "temperature": 0}
    r = both.client.responses.create(**kw)
    (call,) = [i for i in r.output if i.type == "function_call"]
    assert call.name == "get_weather" and call.call_id
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    events = list(both.client.responses.create(stream=True, **kw))
    pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert pieces and "".join(pieces) == call.arguments
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert [d.arguments for d in done] == [call.arguments]
    # The call and its output go back as items: the next turn is served, and the output
    # reaches the template (a longer one makes a longer prompt, by about its length).
    def turn(output: str) -> int:
        nxt = both.client.responses.create(model="tools", tools=[tool], max_output_tokens=4,
                                           temperature=0, input=[
            {"role": "user", "content": ASK},
            {"type": "function_call", "call_id": call.call_id, "name": call.name,
             "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": output}])
        assert nxt.status in ("completed", "incomplete") and nxt.usage is not None
        return nxt.usage.input_tokens
    assert turn("sunny " * 40) > turn("sunny") + 30
    schema = SCHEMAS[7]
    fmt = both.client.responses.create(model="tiny", input=ASK, max_output_tokens=120,
                                       temperature=0, text={"format": {
                                           "type": "json_schema", "name": "out",
                                           "schema": schema, "strict": True}})
    jsonschema.validate(json.loads(fmt.output_text), schema)


# ---- reasoning history ------------------------------------------------------------------------
THOUGHT = "the user greets me, so I greet them back and ask what they need " * 3


def test_reasoning_history_reaches_the_template_in_every_dialect(both: Both) -> None:
    """An earlier assistant turn's reasoning (chat's `reasoning_content`, Anthropic's `thinking`
    blocks, Responses' `reasoning` items) reaches the chat template as that turn's
    `reasoning_content`, which the tools model's template shows in a think block, as Qwen3's
    does: the prompt grows by it, the same in the three dialects."""
    def chat(**assistant: Any) -> int:
        r = both.client.chat.completions.create(model="tools", max_tokens=1, temperature=0,
                                                messages=[  # type: ignore[misc]
            {"role": "user", "content": ASK}, {"role": "assistant", "content": "hi",
                                               **assistant},
            {"role": "user", "content": "again"}])
        assert r.usage is not None
        return r.usage.prompt_tokens
    plain, thought = chat(), chat(reasoning_content=THOUGHT)
    assert thought > plain + 30
    # The answer message as the openai client gives it back, replayed unchanged: its empty
    # fields hold nothing; a non-empty one exod cannot replay is refused by name.
    assert chat(refusal=None, annotations=None, audio=None, function_call=None,
                tool_calls=None, reasoning_content=THOUGHT) == thought
    with pytest.raises(openai.BadRequestError) as e:
        chat(audio={"id": "audio_1"})
    assert e.value.body["param"] == "messages[1].audio"  # type: ignore[index]

    def claude(blocks: list[Any]) -> int:
        return both.claude.messages.count_tokens(model="tools", messages=[
            {"role": "user", "content": ASK}, {"role": "assistant", "content": blocks},
            {"role": "user", "content": "again"}]).input_tokens
    hi = {"type": "text", "text": "hi"}
    assert claude([hi]) == plain
    assert claude([{"type": "thinking", "thinking": THOUGHT, "signature": "s"}, hi]) == thought

    def responses(*before: Any) -> int:
        r = both.client.responses.create(model="tools", max_output_tokens=1, temperature=0,
                                         input=[
            {"role": "user", "content": ASK}, *before,
            {"type": "message", "role": "assistant",
             "content": [{"type": "output_text", "text": "hi"}]},
            {"role": "user", "content": "again"}])
        assert r.usage is not None
        return r.usage.input_tokens
    assert responses() == plain
    assert responses({"type": "reasoning", "id": "rs_1", "summary": [], "content": [
        {"type": "reasoning_text", "text": THOUGHT}]}) == thought


# ---- thinking ---------------------------------------------------------------------------------
def _chat_thinking(both: Both, n: int, thinks: bool) -> Any:
    """Chat completions' answer of the thinking model (its template opens a think block)."""
    return both.client.chat.completions.create(
        model="think", messages=[{"role": "user", "content": ASK}], max_tokens=n, temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": thinks}}).choices[0].message


def _blocks(events: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, list[str]]]:
    """Each content block's type and the types of its deltas, checking start/stop pairs."""
    out: list[tuple[str, list[str]]] = []
    for name, data in events:
        if name == "content_block_start":
            assert data["index"] == len(out)
            out.append((data["content_block"]["type"], []))
        elif name == "content_block_delta":
            assert data["index"] == len(out) - 1
            out[-1][1].append(data["delta"]["type"])
        elif name == "content_block_stop":
            assert data["index"] == len(out) - 1
    return out


def test_messages_thinking_switch_blocks_and_stream(both: Both) -> None:
    """A high `output_config.effort` (or `thinking` enabled) opens the template's think block:
    the answer is a thinking block holding chat's reasoning_content, streamed as thinking_delta
    pieces then signature_delta; disabled (or low effort) gives chat's plain answer."""
    loud, quiet = _chat_thinking(both, 12, True), _chat_thinking(both, 12, False)
    assert loud.reasoning_content and quiet.content  # type: ignore[attr-defined]
    ask: Any = [{"role": "user", "content": ASK}]
    kw: Any = {"model": "think", "max_tokens": 12, "messages": ask,
               "extra_body": {"temperature": 0}}
    effort = both.claude.messages.create(output_config={"effort": "high"}, **kw)
    thinking = [b.thinking for b in effort.content if b.type == "thinking"]
    assert thinking == [loud.reasoning_content]  # type: ignore[attr-defined]
    assert "".join(b.text for b in effort.content if b.type == "text") == (loud.content or "")
    on = both.claude.messages.create(thinking={"type": "enabled", "budget_tokens": 8}, **kw)
    with both.claude.messages.stream(thinking={"type": "enabled", "budget_tokens": 8},
                                     **kw) as s:
        pieces = [e.delta.thinking for e in s  # type: ignore[union-attr]
                  if e.type == "content_block_delta" and e.delta.type == "thinking_delta"]
        final = s.get_final_message()
    assert "".join(pieces) == on.content[0].thinking  # type: ignore[union-attr]
    # The stream's text blocks are the SDK's parsed kind: compared by what they hold.
    assert [b.model_dump(exclude={"parsed_output"}) for b in final.content] == \
        [b.model_dump() for b in on.content]
    events = both.sse("/v1/messages", {"model": "think", "max_tokens": 12, "stream": True,
                                       "temperature": 0, "messages": ask,
                                       "thinking": {"type": "enabled", "budget_tokens": 8}})
    blocks = _blocks(events)
    assert blocks[0][0] == "thinking" and blocks[0][1][-1] == "signature_delta"
    assert set(blocks[0][1][:-1]) == {"thinking_delta"}
    for off in ({"thinking": {"type": "disabled"}}, {"output_config": {"effort": "low"}}):
        plain = both.claude.messages.create(**off, **kw)
        assert [b.type for b in plain.content] == ["text"], off
        assert plain.content[0].text == quiet.content  # type: ignore[union-attr]
    # budget_tokens is checked as Anthropic checks it (below max_tokens).
    with pytest.raises(anthropic.BadRequestError) as e:
        both.claude.messages.create(thinking={"type": "enabled", "budget_tokens": 12}, **kw)
    assert "thinking.budget_tokens" in e.value.message


def test_messages_thinking_budget_closes_the_block_and_the_answer_follows(both: Both) -> None:
    """The random model never closes its think block: with budget_tokens 8 the runner closes
    it after 8 tokens of reasoning (chat's first 8 tokens, all reasoning), and the rest of
    max_tokens is the answer."""
    short = _chat_thinking(both, 8, True)
    assert short.reasoning_content and not short.content  # type: ignore[attr-defined]
    r = both.claude.messages.create(model="think", max_tokens=64,
                                    messages=[{"role": "user", "content": ASK}],
                                    thinking={"type": "enabled", "budget_tokens": 8},
                                    extra_body={"temperature": 0})
    assert [b.type for b in r.content] == ["thinking", "text"]
    assert r.content[0].thinking == short.reasoning_content  # type: ignore[union-attr,attr-defined]
    assert r.content[1].text  # type: ignore[union-attr]


def test_responses_reasoning_items_and_events(both: Both) -> None:
    loud, quiet = _chat_thinking(both, 12, True), _chat_thinking(both, 12, False)
    kw: Any = {"model": "think", "input": ASK, "max_output_tokens": 12, "temperature": 0}
    r = both.client.responses.create(reasoning={"effort": "high"}, **kw)
    (item, *rest) = r.output
    assert item.type == "reasoning" and item.content is not None
    assert [c.text for c in item.content] == [loud.reasoning_content]  # type: ignore[attr-defined]
    assert r.output_text == (loud.content or "")
    assert r.usage is not None and r.usage.output_tokens_details.reasoning_tokens > 0, r.usage
    events = list(both.client.responses.create(reasoning={"effort": "high"}, stream=True, **kw))
    names = [e.type for e in events]
    assert names[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    first_done = names.index("response.reasoning_text.done")
    assert set(names[4:first_done]) == {"response.reasoning_text.delta"}
    assert names[first_done:first_done + 3] == ["response.reasoning_text.done",
                                                "response.content_part.done",
                                                "response.output_item.done"]
    assert events[3].part.type == "reasoning_text"  # type: ignore[union-attr]
    assert "".join(e.delta for e in events  # type: ignore[union-attr]
                   if e.type == "response.reasoning_text.delta") == loud.reasoning_content  # type: ignore[attr-defined]
    streamed = events[-1].response.output  # type: ignore[union-attr]
    assert [i.model_dump(exclude={"id"}) for i in streamed] == [
        i.model_dump(exclude={"id"}) for i in [item, *rest]]
    for effort in ("none", "minimal"):
        plain = both.client.responses.create(reasoning={"effort": effort}, **kw)
        assert [i.type for i in plain.output] == ["message"]
        assert plain.output_text == quiet.content
        assert plain.usage is not None and plain.usage.output_tokens_details.reasoning_tokens == 0


# ---- errors in each dialect's shape -------------------------------------------------------------
def test_queue_full_mid_stream_error_and_overloaded_in_each_dialect(both: Both) -> None:
    """`spare` runs two requests and queues none: a third is 429 (rate_limit_error, with
    retry-after). Stopping it aborts the two streams after the drain: an `error` event ends
    the Messages one, `error` then `response.failed` the Responses one. Stopped, it is
    Anthropic's 529 overloaded_error (OpenAI's 503)."""
    window = both.client.models.retrieve("spare").model_extra["context_length"]  # type: ignore[index]
    ask: Any = [{"role": "user", "content": ASK}]  # greedy: no end token within the window
    with both.claude.messages.stream(model="spare", max_tokens=window - 64, messages=ask,
                                     extra_body={"temperature": 0}) as claude_stream:
        claude_events = iter(claude_stream)
        assert any(e.type == "content_block_delta" for e in claude_events)
        responses_stream = both.client.responses.create(
            model="spare", input=ASK, max_output_tokens=window - 64, temperature=0, stream=True)
        openai_events = iter(responses_stream)
        assert any(e.type == "response.output_text.delta" for e in openai_events)
        with pytest.raises(anthropic.RateLimitError) as full:
            both.claude.messages.create(model="spare", max_tokens=4, messages=ask)
        assert full.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
        assert full.value.response.headers["retry-after"] == "1"
        with pytest.raises(openai.RateLimitError) as full_openai:
            both.client.responses.create(model="spare", input=ASK, max_output_tokens=4)
        assert full_openai.value.code == "queue_full"
        both.d.ctl("stop", "spare")
        with pytest.raises(anthropic.APIStatusError) as mid:
            list(claude_events)
        assert mid.value.body["type"] == "error"  # type: ignore[index]
        assert mid.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
        *_, error, failed = list(openai_events)
        assert error.type == "error" and error.code == "aborted"  # type: ignore[union-attr]
        assert failed.type == "response.failed"
        assert failed.response.status == "failed"  # type: ignore[union-attr]
        assert failed.response.error.code == "server_error"  # type: ignore[union-attr]
    with pytest.raises(anthropic.OverloadedError) as over:
        both.claude.messages.create(model="spare", max_tokens=4, messages=ask)
    assert over.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
    assert over.value.response.headers["retry-after"] == "5"
    with pytest.raises(openai.InternalServerError) as gone:
        both.client.responses.create(model="spare", input=ASK, max_output_tokens=4)
    assert gone.value.status_code == 503


def test_a_tool_result_s_is_error_reaches_the_prompt(both: Both) -> None:
    def turn(**result: Any) -> list[Any]:
        return [{"role": "user", "content": ASK},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1",
                                                   "name": "get_weather", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                              "content": "no such city", **result}]}]
    def count(**result: Any) -> int:
        return both.claude.messages.count_tokens(model="tools", messages=turn(**result),
                                                 tools=[WEATHER_TOOL]).input_tokens
    ok, failed = count(), count(is_error=True)
    assert count(is_error=False) == ok and failed > ok
    r = both.client.chat.completions.create(  # the same turn, as chat completions sends it
        model="tools", max_tokens=1, messages=[  # type: ignore[list-item]
            {"role": "user", "content": ASK},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "t1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "t1", "content": "Error: no such city"}],
        tools=[{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                                 "parameters": WEATHER}}])
    assert r.usage.prompt_tokens == failed  # type: ignore[union-attr]


# ---- every key works, is harmless, is ignored and reported, or is refused by name ---------------
def test_block_and_item_keys_work_or_are_refused_by_name(both: Both) -> None:
    """Claude Code's `cache_control` on blocks and tools is accepted (exod's prompt cache needs
    no hint); a key that would change the answer is refused naming it; one exod does not know
    is ignored and named in the header. Responses output items sent back as they came (`id`,
    `status`) are accepted."""
    cached = {"type": "ephemeral"}
    plain = both.claude.messages.count_tokens(
        model="tools", tools=[WEATHER_TOOL], system=[{"type": "text", "text": "Be brief."}],
        messages=[{"role": "user", "content": [{"type": "text", "text": ASK}]}])
    hinted = both.claude.messages.count_tokens(
        model="tools", tools=[{**WEATHER_TOOL, "cache_control": cached}],  # type: ignore[list-item]
        system=[{"type": "text", "text": "Be brief.", "cache_control": cached}],
        messages=[{"role": "user", "content": [{"type": "text", "text": ASK,
                                                "cache_control": cached}]}])
    assert hinted.input_tokens == plain.input_tokens
    cited = {"type": "text", "text": ASK, "citations": [
        {"type": "char_location", "cited_text": "x", "document_index": 0, "start_char_index": 0,
         "end_char_index": 1}]}
    with pytest.raises(anthropic.BadRequestError) as e:
        both.claude.messages.create(model="tiny", max_tokens=2, messages=[
            {"role": "user", "content": [cited]}])  # type: ignore[list-item]
    assert "`messages[0].content[0].citations`" in e.value.message, e.value.message
    painted = both.claude.messages.with_raw_response.create(model="tiny", max_tokens=2, messages=[
        {"role": "user", "content": [{"type": "text", "text": ASK, "colour": "red"}]}])  # type: ignore[list-item]
    assert painted.headers["x-exod-ignored-fields"] == "messages[].content[].colour"
    first = both.client.responses.create(model="tiny", input=ASK, max_output_tokens=4,
                                         temperature=0)
    again = both.client.responses.create(
        model="tiny", max_output_tokens=4, temperature=0,
        input=[{"role": "user", "content": ASK}, *first.output,  # type: ignore[list-item]
               {"role": "user", "content": "again"}])
    plain_again = both.chat(4, [{"role": "user", "content": ASK},
                                {"role": "assistant", "content": first.output_text},
                                {"role": "user", "content": "again"}])
    assert again.output_text == plain_again.choices[0].message.content
    painted_item = both.client.responses.with_raw_response.create(
        model="tiny", max_output_tokens=4, input=[
            {"type": "message", "role": "user", "content": ASK, "colour": "red"}])  # type: ignore[list-item]
    assert painted_item.headers["x-exod-ignored-fields"] == "input[].colour"


def test_errors_name_the_dialect_s_own_fields(both: Both) -> None:
    """The core checks the translated request; its errors name what the client sent."""
    with pytest.raises(anthropic.BadRequestError) as e:
        both.claude.messages.create(model="tiny", max_tokens=2, messages=[
            {"role": "user", "content": ASK}], tools=[
            {"name": "no spaces allowed", "input_schema": {"type": "object"}}])
    assert "`tools[0].name`" in e.value.message and "function" not in e.value.message
    with pytest.raises(openai.BadRequestError) as o:
        both.client.responses.create(model="tiny", input=ASK, max_output_tokens=-1)
    assert o.value.body["param"] == "max_output_tokens"  # type: ignore[index]
    assert "`max_output_tokens`" in o.value.message


# ---- what the agents send (issue 27) ----------------------------------------------------------
HEADER = "x-exod-ignored-fields"


def _metric(both: Both, dialect: str, field: str) -> float:
    resp, raw = both.raw("GET", "/metrics")
    line = f'exod_ignored_fields_total{{dialect="{dialect}",field="{field}"}} '
    found = [ln for ln in raw.decode().splitlines() if ln.startswith(line)]
    return float(found[0].split()[-1]) if found else 0.0


def test_an_unknown_field_still_gets_its_answer_with_the_header_and_the_metric(
        both: Both) -> None:
    """New client versions keep adding fields: exod answers, names them in the header (streams
    too, before the first byte) and counts them in /metrics, once per request."""
    before = _metric(both, "chat", "brand_new_option")
    r = both.client.chat.completions.with_raw_response.create(
        model="tiny", max_tokens=2, messages=[{"role": "user", "content": ASK}],
        extra_body={"brand_new_option": {"x": 1}})
    assert r.headers[HEADER] == "brand_new_option" and r.parse().choices[0].message.content
    assert _metric(both, "chat", "brand_new_option") == before + 1
    with both.claude.messages.with_streaming_response.create(
            model="tiny", max_tokens=2, stream=True, messages=[{"role": "user", "content": ASK}],
            extra_body={"brand_new_option": 1}) as s:
        assert s.headers[HEADER] == "brand_new_option"
        assert "message_stop" in s.read().decode()
    assert _metric(both, "messages", "brand_new_option") >= 1
    plain = both.client.responses.with_raw_response.create(model="tiny", input=ASK,
                                                           max_output_tokens=2)
    assert HEADER not in plain.headers


def test_hosted_tools_are_not_offered_and_are_reported(both: Both) -> None:
    """Codex attaches `web_search`, Claude Code may attach Anthropic's server tools: the
    model is offered only the client's own tools (the prompt is the same without them)."""
    fn = {"type": "function", "name": "get_weather", "parameters": WEATHER}
    kw: Any = {"model": "tools", "input": ASK, "max_output_tokens": 1, "temperature": 0}
    alone = both.client.responses.create(tools=[fn], **kw)
    hosted = both.client.responses.with_raw_response.create(
        tools=[{"type": "web_search", "external_web_access": False}, fn,  # type: ignore[list-item]
               {"type": "code_interpreter", "container": {"type": "auto"}}], **kw)
    assert hosted.parse().usage.input_tokens == alone.usage.input_tokens  # type: ignore[union-attr]
    assert hosted.headers[HEADER] == "tools[].type=web_search, tools[].type=code_interpreter"
    ask: Any = [{"role": "user", "content": ASK}]
    mine = both.claude.messages.count_tokens(model="tools", messages=ask, tools=[WEATHER_TOOL])
    with_server = both.claude.messages.count_tokens(model="tools", messages=ask, tools=[
        WEATHER_TOOL, {"type": "web_search_20250305", "name": "web_search"}])
    assert with_server.input_tokens == mine.input_tokens


def test_a_system_turn_inside_messages_reaches_the_template(both: Both) -> None:
    """Claude Code sends its environment as a `system` turn inside `messages`: it reaches the
    template where it stands (this template renders a system turn anywhere; one that takes it
    only first gets it joined to the leading one: test_system_turns_go_where_the_template_...)."""
    convo: list[Any] = [{"role": "user", "content": ASK},
                        {"role": "system", "content": "# Environment\ncwd: /tmp"},
                        {"role": "user", "content": "again"}]
    counted = both.claude.messages.count_tokens(model="tools", system="Be brief.",
                                                messages=convo)
    chat = both.client.chat.completions.create(
        model="tools", max_tokens=1, messages=[{"role": "system", "content": "Be brief."},
                                               *convo])
    assert counted.input_tokens == chat.usage.prompt_tokens  # type: ignore[union-attr]


def test_thinking_display_omitted_and_its_signature_round_trips(both: Both) -> None:
    """`display: omitted`: thinking blocks come back with an empty `thinking` and a signature
    (no thinking_delta when streamed); sent back, the signature gives the reasoning back to the
    prompt; one exod did not make is ignored and reported."""
    loud = _chat_thinking(both, 12, True)
    kw: Any = {"model": "think", "max_tokens": 12, "messages": [{"role": "user", "content": ASK}],
               "thinking": {"type": "adaptive", "display": "omitted"},
               "extra_body": {"temperature": 0}}
    r = both.claude.messages.create(**kw)
    block = r.content[0]
    assert block.type == "thinking" and block.thinking == "" and block.signature
    events = both.sse("/v1/messages", {"model": "think", "max_tokens": 12, "stream": True,
                                       "temperature": 0, "messages": kw["messages"],
                                       "thinking": kw["thinking"]})
    assert _blocks(events)[0] == ("thinking", ["signature_delta"])

    def counted(thought: dict[str, Any]) -> int:
        return both.claude.messages.count_tokens(model="tools", messages=[
            {"role": "user", "content": ASK},
            {"role": "assistant", "content": [thought, {"type": "text", "text": "hi"}]},
            {"role": "user", "content": "again"}]).input_tokens
    whole = counted({"type": "thinking", "thinking": loud.reasoning_content,  # type: ignore[attr-defined]
                     "signature": "x"})
    assert counted({"type": "thinking", "thinking": "", "signature": block.signature}) == whole
    foreign = {"type": "thinking", "thinking": "", "signature": "EqQBCkYIBxgCKkBz"}
    resp, raw = both.raw("POST", "/v1/messages/count_tokens", {
        "model": "tools", "messages": [{"role": "user", "content": ASK},
                                       {"role": "assistant", "content": [foreign]},
                                       {"role": "user", "content": "again"}]})
    assert resp.status == 200 and resp.getheader(HEADER) == "messages[].content[].signature"


def test_context_management_edits_apply_and_are_reported(both: Both) -> None:
    """Claude Code's `clear_thinking_20251015` keep all changes nothing; keeping one turn's
    thinking drops the older turns' from the prompt, as `clear_tool_uses_20250919` replaces
    older tool results: count_tokens gives the edited length and the original, the answer
    reports the edits as Anthropic does."""
    def turn(i: int) -> list[Any]:
        return [{"role": "assistant", "content": [
                    {"type": "thinking", "thinking": THOUGHT, "signature": "s"},
                    {"type": "tool_use", "id": f"t{i}", "name": "get_weather",
                     "input": {"city": "Paris"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{i}",
                                              "content": "sunny " * 20}]}]
    convo: list[Any] = [{"role": "user", "content": ASK}, *turn(1), *turn(2)]
    body: dict[str, Any] = {"model": "tools", "messages": convo, "tools": [WEATHER_TOOL]}

    def count(*edits: Any) -> dict[str, Any]:
        resp, raw = both.raw("POST", "/v1/messages/count_tokens", {
            **body, "context_management": {"edits": list(edits)}})
        assert resp.status == 200, raw
        return json.loads(raw)  # type: ignore[no-any-return]
    plain = count()
    assert count({"type": "clear_thinking_20251015", "keep": "all"}) == plain
    thinner = count({"type": "clear_thinking_20251015",
                     "keep": {"type": "thinking_turns", "value": 1}})
    assert thinner["input_tokens"] < plain["input_tokens"]
    assert thinner["context_management"] == {"original_input_tokens": plain["input_tokens"]}
    cleared = count({"type": "clear_tool_uses_20250919",
                     "trigger": {"type": "tool_uses", "value": 1},
                     "keep": {"type": "tool_uses", "value": 1}})
    assert cleared["input_tokens"] < plain["input_tokens"]
    resp, raw = both.raw("POST", "/v1/messages", {
        **body, "max_tokens": 2, "temperature": 0, "context_management": {"edits": [
            {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns",
                                                        "value": 1}}]}})
    answer = json.loads(raw)
    assert answer["context_management"] == {"applied_edits": [
        {"type": "clear_thinking_20251015", "cleared_thinking_turns": 1,
         "cleared_input_tokens": plain["input_tokens"] - thinner["input_tokens"]}]}
    assert prompt_of(answer["usage"]) == thinner["input_tokens"]


def test_encrypted_reasoning_round_trips_and_a_foreign_one_is_reported(both: Both) -> None:
    """Codex asks for `reasoning.encrypted_content` with `store: false` and sends reasoning
    items back with it and no content: exod's own gives the reasoning back to the prompt."""
    loud = _chat_thinking(both, 12, True)
    r = both.client.responses.create(model="think", input=ASK, max_output_tokens=12,
                                     temperature=0, reasoning={"effort": "high"}, store=False,
                                     include=["reasoning.encrypted_content"])
    item = r.output[0]
    assert item.type == "reasoning" and item.encrypted_content
    assert [c.text for c in item.content or []] == [loud.reasoning_content]  # type: ignore[attr-defined]

    def prompt(reasoning: dict[str, Any]) -> Any:
        return both.client.responses.with_raw_response.create(
            model="tools", max_output_tokens=1, temperature=0, input=[
                {"role": "user", "content": ASK}, {"type": "reasoning", "id": "rs_1",
                                                   "summary": [], **reasoning},
                {"type": "message", "role": "assistant",
                 "content": [{"type": "output_text", "text": "hi"}]},
                {"role": "user", "content": "again"}])
    def tokens(raw: Any) -> int:
        return raw.parse().usage.input_tokens  # type: ignore[no-any-return]
    text = tokens(prompt({"content": [{"type": "reasoning_text",
                                       "text": loud.reasoning_content}]}))  # type: ignore[attr-defined]
    assert tokens(prompt({"encrypted_content": item.encrypted_content})) == text
    foreign = prompt({"encrypted_content": "gAAAAABpZ-opaque"})
    assert foreign.headers[HEADER] == "input[].encrypted_content"
    assert tokens(foreign) < text


def test_a_namespace_s_function_is_called_and_comes_back_namespaced(both: Both) -> None:
    """Codex's `namespace` tools: the model is offered `weather__get_weather`; the call comes
    back as a function_call with `name` and `namespace` apart (whole and streamed), as Codex's
    router reads it, and goes back into the next turn under the name the model knows."""
    ns: Any = {"type": "namespace", "name": "weather", "description": "Weather tools",
               "tools": [{"type": "function", "name": "get_weather", "strict": True,
                          "parameters": WEATHER}]}
    kw: Any = {"model": "tools", "input": ASK, "max_output_tokens": 160, "temperature": 0,
               "tools": [ns], "parallel_tool_calls": False,
               "tool_choice": {"type": "function", "name": "weather__get_weather"}}
    r = both.client.responses.create(**kw)
    (call,) = [i for i in r.output if i.type == "function_call"]
    dumped = call.model_dump()
    assert (dumped["name"], dumped["namespace"]) == ("get_weather", "weather")
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    events = list(both.client.responses.create(stream=True, **kw))
    added = [e.item.model_dump() for e in events if e.type == "response.output_item.added"
             and e.item.type == "function_call"]  # type: ignore[union-attr]
    assert [(a["name"], a["namespace"]) for a in added] == [("get_weather", "weather")]
    again = both.client.responses.create(model="tools", max_output_tokens=1, temperature=0,
                                         tools=[ns], input=[
        {"role": "user", "content": ASK}, dumped,
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    assert again.status in ("completed", "incomplete")


def test_models_tell_clients_the_context_and_the_capabilities(both: Both) -> None:
    """What clients size themselves by, read from the model's files without loading it."""
    by_id = {m.id: m.model_extra for m in both.client.models.list().data}
    for name, tools, thinks in (("tiny", False, False), ("tools", True, False),
                                ("think", False, True)):
        m = by_id[name]
        assert m is not None and m["context_length"] == m["max_model_len"] > 0
        assert m["max_input_tokens"] == m["context_length"]
        assert m["capabilities"]["tools"]["supported"] is tools, name
        assert m["capabilities"]["thinking"]["supported"] is thinks, name
        assert ("tools" in m["supported_parameters"]) is tools
    claude = both.claude.beta.models.retrieve("think")
    assert claude.max_input_tokens == by_id["think"]["context_length"]  # type: ignore[index]
    assert claude.capabilities is not None and claude.capabilities.thinking.supported


SYSTEM_ONLY_FIRST = (  # as Mistral's and Gemma's templates, which refuse a system turn later
    "{% for m in messages %}{% if m.role == 'system' and not loop.first %}"
    "{{ raise_exception('System message must be at the beginning.') }}{% endif %}"
    "{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def test_system_turns_go_where_the_template_takes_them(demo_model: Path, tiny_model: Path,
                                                       tmp_path: Path) -> None:
    """The demo model's template (SmolLM2's) renders a system turn anywhere: it stays in
    place. A template that takes one only first gets every system turn joined to the leading
    one, rather than a 400. (The runner's own tokenizer; no model is loaded. In a child
    process: the test process never imports mlx, which other tests check.)"""
    code = ("import sys; from pathlib import Path; from tests.integration.test_dialects import "
            "system_turns; system_turns(*map(Path, sys.argv[1:]))")
    res = subprocess.run([sys.executable, "-c", code, str(demo_model), str(tiny_model),
                          str(tmp_path)], check=False, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-4000:]


def system_turns(demo_model: Path, tiny_model: Path, tmp_path: Path) -> None:
    import shutil

    from mlx_lm.tokenizer_utils import load as load_tokenizer

    from exod.core.context_edits import system_first
    from exod.runner.serving.prepare import chat_prompt
    convo = [{"role": "user", "content": ASK}, {"role": "system", "content": "cwd: /tmp"},
             {"role": "user", "content": "again"}]
    demo = load_tokenizer(demo_model)
    assert chat_prompt(demo, convo) == list(demo.apply_chat_template(
        convo, add_generation_prompt=True))
    strict = tmp_path / "strict"
    shutil.copytree(tiny_model, strict, ignore=shutil.ignore_patterns(".exod-*"))
    config = json.loads((strict / "tokenizer_config.json").read_text())
    (strict / "tokenizer_config.json").write_text(json.dumps(
        {**config, "chat_template": SYSTEM_ONLY_FIRST}))
    tok = load_tokenizer(strict)
    with pytest.raises(Exception, match="at the beginning"):
        tok.apply_chat_template(convo, add_generation_prompt=True)
    assert chat_prompt(tok, convo) == list(tok.apply_chat_template(
        system_first(convo), add_generation_prompt=True))


def test_strict_fields_refuse_the_unknown_and_still_take_hosted_tools(tiny_model: Path) -> None:
    """With api.strict_fields a field exod does not know is a 400 naming it, before any runner
    is asked; a hosted tool is never refused, and the answer (here the 503 of an instance not
    started) names it in the header. No runner starts: the daemon alone."""
    d = Daemon({"api": {"listen": "127.0.0.1:0", "strict_fields": True},
                "instances": {"idle": {"model": str(tiny_model), "autostart": False}}})
    try:
        d.start()
        served = Served(d, tiny_model)
        resp, raw = served.raw("POST", "/v1/chat/completions", {
            "model": "idle", "messages": [{"role": "user", "content": ASK}], "brand_new": 1},
            token=None)
        err = json.loads(raw)["error"]
        assert resp.status == 400 and err["param"] == "brand_new", err
        assert "strict_fields" in err["message"]
        resp, raw = served.raw("POST", "/v1/responses", {
            "model": "idle", "input": ASK, "tools": [{"type": "web_search"}]}, token=None)
        assert resp.status == 503, raw
        assert resp.getheader(HEADER) == "tools[].type=web_search"
    finally:
        d.close()
