"""Ollama's dialect, its pure parts: bodies of /api/chat and /api/generate onto the one request
(exod.api.dialects.ollama.request), the answer's NDJSON lines and statistics
(exod.api.dialects.ollama.output), a client's own Go template, fill in the middle, the objects
of the read-only endpoints and the names of a pull; hostile bodies fuzzed as the other
dialects' are."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exod.wire import messages as m
from exod.api.dialects.ollama.output import OllamaOutput
from exod.api.dialects.ollama.request import UNBOUNDED, fill_in_middle, parse, render
from exod.api.errors import ApiError
from exod.api.dialects.ollama import objects
from exod.api.dialects.ollama.manage import repository, status_line
from exod.api.request import ModelLimits, apply_limits
from exod.api.reply import Deltas, Finished, Reply
from exod.facts.caps import Capabilities
from exod.facts.details import ModelFacts
from exod.wire.control import DownloadEvent
from exod.core.hub_ref import HubRef
from exod.wire.messages import decode_to_runner, to_wire

HELLO = [{"role": "user", "content": "hello"}]


def refused(body: dict[str, Any], endpoint: str = "chat") -> ApiError:
    with pytest.raises(ApiError) as e:
        parse(body, endpoint)  # type: ignore[arg-type]
    assert e.value.status == 400
    return e.value


# ---- requests --------------------------------------------------------------------------------
def test_chat_options_map_onto_the_core_under_their_names() -> None:
    req, view = parse({"model": "llama3.2:latest", "messages": HELLO, "stream": False,
                       "keep_alive": "5m", "think": "low", "format": "json", "options": {
                           "num_predict": 7, "num_ctx": 512, "temperature": 0.5, "top_p": 0.9,
                           "top_k": 40, "min_p": 0.05, "seed": 3, "stop": ["\n"],
                           "repeat_penalty": 1.1, "repeat_last_n": 64, "presence_penalty": 0.2,
                           "frequency_penalty": 0.1, "mirostat": 0, "tfs_z": 1, "num_gpu": 99,
                           "num_thread": 8}}, "chat")
    assert req is not None and not view.load_only
    g = req.gen
    assert (req.model, req.stream, view.keep_alive, view.think) == ("llama3.2:latest", False,
                                                                     300, False)
    assert (g.max_tokens, g.context_window, g.temperature, g.top_p, g.top_k, g.min_p, g.seed,
            g.stop) == (7, 512, 0.5, 0.9, 40, 0.05, 3, ["\n"])
    assert (g.repetition_penalty, g.presence_penalty, g.frequency_penalty) == (1.1, 0.2, 0.1)
    assert (g.repetition_context_size, g.presence_context_size, g.frequency_context_size) == (
        64, 64, 64)
    assert g.chat_template_kwargs == {"enable_thinking": False}
    assert g.response_format == {"type": "json_object"}
    assert g.named("max_tokens") == "options.num_predict"
    assert g.named("context_window") == "options.num_ctx"
    assert decode_to_runner(json.loads(json.dumps(to_wire(g)))) == g


def test_defaults_stream_and_leave_the_length_to_the_context() -> None:
    req, view = parse({"model": "m", "messages": HELLO}, "chat")
    assert req is not None and req.stream and view.keep_alive is None
    assert req.gen.max_tokens == UNBOUNDED and req.gen.context_window is None
    limited = apply_limits(req, ModelLimits(1000, 4096, cap=100))
    assert limited.gen.max_tokens == 100  # clamped to the instance's cap, as every dialect
    off, _ = parse({"model": "m", "messages": HELLO, "options": {"repeat_last_n": 0,
                                                                 "repeat_penalty": 1.5}}, "chat")
    assert off is not None and off.gen.repetition_penalty == 1.0


@pytest.mark.parametrize("body, param", [
    ({"options": {"mirostat": 2}}, "options.mirostat"),
    ({"options": {"tfs_z": 0.5}}, "options.tfs_z"),
    ({"options": {"typical_p": 0.7}}, "options.typical_p"),
    ({"options": {"temperature": "hot"}}, "options.temperature"),
    ({"options": {"num_predict": 0}}, "options.num_predict"),
    ({"options": {"num_ctx": 0}}, "options.num_ctx"),
    ({"options": {"repeat_last_n": -2}}, "options.repeat_last_n"),
    ({"options": []}, "options"),
    ({"format": "yaml"}, "format"),
    ({"format": ["x"]}, "format"),
    ({"think": "max"}, "think"),
    ({"keep_alive": "soon"}, "keep_alive"),
    ({"stream": "yes"}, "stream"),
    ({"messages": [{"role": "user", "content": "x", "images": ["not base64!"]}]},
     "messages[0].images[0]"),
    ({"messages": [{"role": "user", "content": "x", "images": "aGk="}]}, "messages[0].images"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": [
        {"function": {"name": "f", "arguments": {}}}]}]}, "messages[0].tool_calls"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments":
                                                                      "[1]"}}]}]},
     "messages[0].tool_calls[0].function.arguments"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]},
     "tools[0].function.name"),
])
def test_a_field_exod_cannot_serve_is_refused_by_its_name(body: dict[str, Any],
                                                          param: str) -> None:
    assert refused({"model": "m", "messages": HELLO, **body}).param == param


def test_generate_refuses_what_needs_an_image_or_a_context() -> None:
    for body, param in (({"images": ["aGk="], "raw": True}, "images"),
                        ({"context": [1, 2]}, "context"),
                        ({"width": 512}, "width"), ({"raw": True, "system": "s"}, "system"),
                        ({"suffix": "x", "system": "s"}, "system"),
                        ({"template": "{{ .Messages }}"}, "template"),
                        ({"template": "{{ if .System }}x"}, "template")):
        assert refused({"model": "m", "prompt": "p", **body}, "generate").param == param


def test_images_become_image_parts_before_the_text() -> None:
    req, _ = parse({"model": "m", "messages": [
        {"role": "user", "content": "what is it?", "images": ["aGk=", "aG8="]},
        {"role": "assistant", "content": "a cat"},
        {"role": "user", "content": "", "images": ["aGV5"]}]}, "chat")
    assert req is not None and [i.data for i in req.gen.images] == ["aGk=", "aG8=", "aGV5"]
    first, _, last = req.gen.messages or []
    assert first["content"] == [{"type": "image", "image": 0}, {"type": "image", "image": 1},
                                {"type": "text", "text": "what is it?"}]
    assert last["content"] == [{"type": "image", "image": 2}]
    # A text model's runner refuses the first image part: named as the client sent it.
    assert req.gen.named("messages[0].content[1]") == "messages[0].images[1]"
    gen, _ = parse({"model": "m", "prompt": "what?", "system": "s", "images": ["aGk="]},
                   "generate")
    assert gen is not None and gen.gen.named("messages[1].content[0]") == "images[0]"
    assert decode_to_runner(json.loads(json.dumps(to_wire(gen.gen)))) == gen.gen


def test_tool_turns_are_paired_with_the_calls_they_answer() -> None:
    req, _ = parse({"model": "m", "tools": [{"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object"}}}], "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "get_time", "arguments": {}}},
            {"function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
        {"role": "tool", "content": "noon"}]}, "chat")
    assert req is not None
    _, assistant, weather, time_ = req.gen.messages or []
    ids = [c["id"] for c in assistant["tool_calls"]]
    assert assistant["tool_calls"][1]["function"] == {"name": "get_weather",
                                                      "arguments": {"city": "Oslo"}}
    assert (weather["tool_call_id"], weather["name"]) == (ids[1], "get_weather")
    assert time_["tool_call_id"] == ids[0]  # the one left
    assert req.gen.tools[0]["function"]["name"] == "get_weather"


def test_a_body_with_nothing_to_generate_loads_or_unloads() -> None:
    for body, endpoint in (({"messages": []}, "chat"), ({}, "chat"), ({"prompt": ""},
                                                                      "generate")):
        req, view = parse({"model": "m", "keep_alive": 0, **body}, endpoint)  # type: ignore
        assert req is None and view.load_only and view.keep_alive == 0
    _, view = parse({"model": "m", "keep_alive": -1}, "generate")
    assert view.keep_alive == math.inf


def test_generate_through_the_template_raw_or_a_go_template() -> None:
    req, _ = parse({"model": "m", "prompt": "p", "system": "s"}, "generate")
    assert req is not None and req.gen.kind == "chat"
    assert req.gen.messages == [{"role": "system", "content": "s"},
                                {"role": "user", "content": "p"}]
    raw, _ = parse({"model": "m", "prompt": "<s>p", "raw": True}, "generate")
    assert raw is not None and (raw.gen.kind, raw.gen.prompt) == ("completion", "<s>p")
    own, _ = parse({"model": "m", "prompt": "p", "system": "s", "template":
                    "{{- if .System }}S:{{ .System }} {{ end -}}\nU:{{ .Prompt }}\nA:"},
                   "generate")
    assert own is not None and own.gen.prompt == "S:s U:p\nA:"


def test_go_templates_in_the_subset_prompts_use() -> None:
    t = "{{ if .System }}<sys>{{ .System }}</sys>{{ else }}none{{ end }}|{{ .Prompt }}" \
        "{{ if .Suffix }}<fim>{{ .Suffix }}{{ end }}{{ .Response }}"
    assert render(t, "", "p", "") == "none|p"
    assert render(t, "s", "p", "x") == "<sys>s</sys>|p<fim>x"
    assert render("a  {{- .Prompt -}}  b", "", "p", "") == "apb"


def test_fill_in_the_middle_in_the_models_tokens() -> None:
    req, view = parse({"model": "m", "prompt": "def f(", "suffix": "    return x"},
                      "generate")
    assert req is not None and view.suffix == "    return x"
    tokens = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")
    placed = fill_in_middle(req, view.suffix, tokens, "coder")
    assert placed.gen.prompt == "<|fim_prefix|>def f(<|fim_suffix|>    return x<|fim_middle|>"
    assert placed.gen.kind == "completion"
    with pytest.raises(ApiError) as e:
        fill_in_middle(req, view.suffix, None, "tiny")
    assert e.value.param == "suffix" and "'tiny' has no fill-in-the-middle" in e.value.message


# ---- answers ---------------------------------------------------------------------------------
def stream(out: OllamaOutput, events: list[m.Event]) -> list[dict[str, Any]]:
    """Events through the core's typed pieces and the output, as exod.api.serving streams
    them."""
    deltas = Deltas()
    raw = out.begin()
    for ev in events:
        out.seen(ev)
        if isinstance(ev, (m.Text, m.ToolCall, m.Done)):
            raw += out.delta(deltas.of(ev))
    raw += out.end()
    return [json.loads(x) for x in raw.splitlines()]


def test_a_chat_stream_as_ollama_streams_it() -> None:
    lines = stream(OllamaOutput("chat", "tiny"), [
        m.Prefill("1", 0, 0), m.Prefill("1", 5, 5), m.Text("1", "", reasoning="hmm"),
        m.Text("1", "Hi"), m.ToolCall("1", "add", '{"a": 1, "b": "' + "x" * 100 + '"}'),
        m.ToolCall("1", "sub", "{}"), m.Done("1", "tool_calls", 5, 4)])
    assert [x["message"].get("thinking") for x in lines[:1]] == ["hmm"]
    assert lines[1]["message"] == {"role": "assistant", "content": "Hi"}
    calls = lines[2]["message"]["tool_calls"]
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        ("add", {"a": 1, "b": "x" * 100}), ("sub", {})]
    last = lines[-1]
    assert len(lines) == 4 and last["done"] and last["done_reason"] == "stop"
    assert (last["prompt_eval_count"], last["eval_count"]) == (5, 4)
    stats = ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration")
    assert all(isinstance(last[k], int) and last[k] >= 0 for k in stats)
    assert last["total_duration"] >= last["load_duration"] + last["eval_duration"]
    assert not any(x["done"] for x in lines[:-1])


def test_a_generate_answer_whole_and_streamed() -> None:
    lines = stream(OllamaOutput("generate", "tiny", "completion"),
                   [m.Text("1", "a"), m.Text("1", "b"), m.Done("1", "length", 3, 2)])
    assert [x["response"] for x in lines] == ["a", "b", ""]
    assert lines[-1]["done_reason"] == "length" and "message" not in lines[-1]
    out = OllamaOutput("generate", "tiny", "completion")
    out.seen(m.Done("1", "stop", 3, 2))
    whole = out.whole(Reply("ab", Finished.of(m.Done("1", "stop", 3, 2))))
    assert (whole["response"], whole["done"], whole["eval_count"]) == ("ab", True, 2)


# ---- the read-only endpoints and pulls -------------------------------------------------------
def test_show_has_what_copilot_reads() -> None:
    facts = ModelFacts(size=10, digest="d" * 64, modified=0, family="qwen3", parameters=8 * 10**9,
                       quantization="Q4", context_length=40960, block_count=36)
    shown = objects.show(facts, Capabilities(tools=True, thinking=True,
                                             fim=("a", "b", "c")), "{{tpl}}", "hf:org/x", 32768)
    assert shown["model_info"]["general.architecture"] == "qwen3"
    assert shown["model_info"]["qwen3.context_length"] == 32768  # the instance's window
    assert shown["capabilities"] == ["completion", "tools", "thinking", "insert"]
    assert objects.capabilities(Capabilities(), sees=True) == ["completion", "vision"]
    assert shown["details"]["parameter_size"] == "8.0B"
    assert [int(x) for x in objects.API_VERSION.split(".")] >= [0, 6, 4]
    assert objects.tag("tiny", facts)["modified_at"] == "1970-01-01T00:00:00Z"


@pytest.mark.parametrize("name, ref", [
    ("hf.co/org/tiny", HubRef("org/tiny")), ("hf.co/org/tiny:latest", HubRef("org/tiny")),
    ("huggingface.co/org/tiny:v2", HubRef("org/tiny", "v2")), ("org/tiny", HubRef("org/tiny")),
    ("hf:org/tiny@v1", HubRef("org/tiny", "v1")), ("llama3.2", None), ("tiny:latest", None),
    ("a/b/c", None)])
def test_the_names_a_pull_takes(name: str, ref: HubRef | None) -> None:
    assert repository(name) == ref


def test_pull_status_lines_as_ollama_streams_them() -> None:
    ref = HubRef("org/tiny")
    assert status_line(ref, DownloadEvent("x")) == {"status": "pulling manifest"}
    assert status_line(ref, DownloadEvent("x", "downloading", 5, 10, 3)) == {
        "status": "pulling org/tiny", "digest": "hf:org/tiny", "total": 10, "completed": 5}
    assert status_line(ref, DownloadEvent("x", "verifying", 5, 10)) == {
        "status": "verifying sha256 digest"}


# ---- hostile bodies ----------------------------------------------------------------------------
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=3),
    max_leaves=12)
OPTION = st.sampled_from(["num_predict", "num_ctx", "temperature", "top_p", "top_k", "min_p",
                          "seed", "stop", "repeat_penalty", "repeat_last_n", "mirostat",
                          "tfs_z", "presence_penalty", "frequency_penalty", "num_gpu", "x"])
TURN = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool"]) | JSON},
    optional={"content": JSON | st.text(max_size=5), "thinking": JSON,
              "tool_name": JSON | st.just("f"), "tool_call_id": JSON, "images": JSON,
              "tool_calls": JSON | st.lists(st.fixed_dictionaries({"function": st.dictionaries(
                  st.sampled_from(["name", "arguments", "index"]),
                  JSON | st.just("f") | st.just('{"a": 1}'))}), max_size=2)})
NEAR = {
    "messages": JSON | st.lists(TURN, max_size=3),
    "options": JSON | st.dictionaries(OPTION, JSON | st.floats(-3, 3) | st.integers(-3, 9)),
    "format": JSON | st.sampled_from(["", "json"]) | st.just({"type": "object"}),
    "think": JSON | st.sampled_from(["high", "low"]), "keep_alive": JSON | st.text(max_size=4),
    "tools": JSON | st.lists(st.just({"type": "function", "function": {"name": "f"}}),
                             max_size=2),
    "prompt": JSON | st.text(max_size=5), "suffix": JSON, "system": JSON, "template": JSON |
    st.sampled_from(["{{ .Prompt }}", "{{ if .System }}{{ end }}", "{{ .X }}", "{{"]),
    "raw": JSON, "stream": JSON, "logprobs": JSON, "top_logprobs": JSON, "context": JSON}


@settings(max_examples=500, deadline=None)
@given(st.fixed_dictionaries({"model": st.just("m") | JSON}, optional=NEAR),
       st.sampled_from(["chat", "generate"]))
def test_ollama_bodies_are_served_or_refused_by_name(body: dict[str, Any], endpoint: str) -> None:
    """Either a request that survives the wire to the runner, or a 400 naming a field; never
    another exception (which the API would answer with a 5xx)."""
    try:
        req, view = parse(body, endpoint)  # type: ignore[arg-type]
        if req is not None and view.suffix is not None:
            req = fill_in_middle(req, view.suffix, ("<p>", "<s>", "<m>"), "m")
        if req is not None:
            req = apply_limits(req, ModelLimits(1000, 4096))
    except ApiError as e:
        assert e.status == 400 and e.message
        return
    if req is not None:
        assert decode_to_runner(json.loads(json.dumps(to_wire(req.gen)))) == req.gen
