"""The typed messages of the daemon ↔ runner channel: every type survives the wire, and every
malformed object is a ProtocolError (never another exception, never a half-checked message)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exod.wire import messages as m
from exod.wire.protocol import FrameDecoder, ProtocolError, encode

EXAMPLES: list[m.Message] = [
    m.Hello(version=m.VERSION, pid=42),
    m.Status(m.Phase.CONNECTING, "connecting to 1 peer (attempt 2)", attempt=2),
    m.Status(m.Phase.SERVING, "serving 3 request(s)", active=3),
    m.LoadProgress(17, 80),
    m.Ready(vocab_size=49152, context_length=8192),
    m.Ready(),
    m.Failed("cannot load: ünïcode ✓", 65),
    m.Heartbeat(),
    m.Stopping("asked by exod"),
    m.ServingReport(batching="continuous", width=8, active=2, prefill_step=256,
                    cache_max_bytes=2**30, cache_entries=3, cache_bytes=5 * 2**20,
                    cache_lookups=9, cache_hits=4, cached_tokens=600, prompt_tokens=1200),
    m.ServingReport(batching="one request at a time: …", width=1, active=0),
    m.ServingReport(batching="continuous", width=4, active=9, fair=True),
    m.Prefill("r1", 2048, 5000),
    m.Held("r1", 3),
    m.Text("r1", "漢字 and emoji 🎉"),
    m.Text("r1", "", "thinking…", [m.TokenLogprob("Hi", -0.25, [72, 105],
                                                   [m.TopLogprob("Hi", -0.25, [72, 105])]),
                                    m.TokenLogprob("\ufffd", -9999.0, [0xC3])]),
    m.Done("r1", "stop", 12, 0, "\n", cached_tokens=11),
    m.Done("r1", "length", 12, 34),
    m.ToolCall("r1", "get_weather", '{"city": "Oslo"}'),
    m.Done("r1", "tool_calls", 12, 34),
    m.Error("r1", "aborted", "drain over"),
    m.Generate(id="r2", kind="chat", max_tokens=5, temperature=0.0, stop=["\n"], seed=7,
               logit_bias={"12": -100.0}, messages=[{"role": "user", "content": "hi"}]),
    m.Generate(id="r3", kind="completion", max_tokens=16, prompt="Once"),
    m.Generate(id="r3k", kind="completion", max_tokens=16, prompt="Once", key="night-job",
               weight=0.5, priority="batch"),
    m.Generate(id="r4", kind="chat", max_tokens=64, messages=[
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
        tools=[{"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}}}}],
        tool_choice="function", tool_name="get_weather", parallel_tool_calls=False,
        response_format={"type": "json_schema", "schema": {"type": "object"}, "strict": True}),
    m.Generate(id="r5", kind="chat", max_tokens=5, messages=[{"role": "user", "content": "hi"}],
               top_k=40, min_p=0.05, repetition_penalty=1.1, repetition_context_size=64,
               presence_penalty=0.5, frequency_penalty=-0.5, logprobs=True, top_logprobs=3,
               chat_template_kwargs={"enable_thinking": False, "x": [1, {"y": None}]}),
    m.Generate(id="r6", kind="chat", max_tokens=5, images=[m.Image("iVBORw0K"), m.Image("/9j/")],
               messages=[{"role": "user", "content": [
                   {"type": "image", "image": 1}, {"type": "text", "text": "and"},
                   {"type": "image", "image": 0}]}, {"role": "assistant", "content": "two"}]),
    m.Cancel("r2"),
    m.Shutdown(drain=4.0),
]


def wire_round_trip(msg: m.Message) -> m.Message:
    (frame,) = FrameDecoder().feed(encode(m.to_wire(msg)))
    table = m.FROM_RUNNER if msg.type in m.FROM_RUNNER else m.TO_RUNNER
    got: m.Message = m.from_wire(frame, table)
    return got


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda x: x.type)
def test_every_message_survives_the_wire(msg: m.Message) -> None:
    assert wire_round_trip(msg) == msg


def test_the_two_directions_are_distinct() -> None:
    assert not set(m.FROM_RUNNER) & set(m.TO_RUNNER)
    with pytest.raises(ProtocolError, match="unknown message type"):
        m.decode_from_runner(m.to_wire(m.Shutdown(drain=1.0)))  # a runner cannot send this
    with pytest.raises(ProtocolError, match="unknown message type"):
        m.decode_to_runner(m.to_wire(m.Ready()))


@pytest.mark.parametrize("obj, fragment", [
    ({}, "unknown message type None"),
    ({"type": 3}, "unknown message type 3"),
    ({"type": "progress", "loaded": 1}, "missing field 'total'"),
    ({"type": "progress", "loaded": True, "total": 2}, "progress.loaded"),
    ({"type": "progress", "loaded": 1.5, "total": 2}, "progress.loaded"),
    ({"type": "progress", "loaded": 1, "total": 2, "x": 0}, "unknown field(s) x"),
    ({"type": "status", "phase": "dancing"}, "status.phase"),
    ({"type": "done", "id": "r", "finish_reason": "bored", "prompt_tokens": 1,
      "completion_tokens": 1}, "done.finish_reason"),
    ({"type": "error", "id": "r", "code": "oops", "message": "m"}, "error.code"),
    ({"type": "text", "id": 5, "text": "t"}, "text.id"),
    ({"type": "text", "id": "r", "text": None}, "text.text"),
    ({"type": "failed", "reason": "r", "exit_code": "65"}, "failed.exit_code"),
    ({"type": "hello", "version": 1, "pid": None}, "hello.pid"),
    ({"type": "progress", "loaded": 5, "total": 4}, "5 of 4 layers"),
    ({"type": "progress", "loaded": -1, "total": 4}, "-1 of 4 layers"),
    ({"type": "progress", "loaded": 0, "total": -4}, "0 of -4 layers"),
    ({"type": "ready", "vocab_size": -1}, "negative"),
    ({"type": "ready", "context_length": -1}, "negative"),
    ({"type": "prefill", "id": "r1", "done": 9, "total": 8}, "9 of 8 tokens"),
    ({"type": "text", "id": "r", "text": "", "logprobs": [{"token": "a", "logprob": "x",
                                                          "bytes": [97]}]}, "text.logprobs"),
    ({"type": "text", "id": "r", "text": "", "logprobs": [{"token": "a", "logprob": -1.0}]},
     "missing field 'bytes'"),
    ({"type": "text", "id": "r", "text": "", "logprobs": [{"token": "a", "logprob": -1.0,
                                                          "bytes": [], "extra": 1}]},
     "unknown field"),
    ({"type": "text", "id": "r", "text": "", "logprobs": [{"token": "a", "logprob": -1.0,
                                                          "bytes": [], "top": [3]}]},
     "text.logprobs.top"),
    ({"type": "serving", "batching": "x" * 501, "width": 1, "active": 0}, "longer than 500"),
    ({"type": "serving", "batching": "c", "width": 1, "active": 0, "cache_hits": -1},
     "cache_hits is negative"),
], ids=str)
def test_malformed_from_the_runner(obj: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ProtocolError) as info:
        m.decode_from_runner(obj)
    assert fragment in str(info.value)


@pytest.mark.parametrize("obj, fragment", [
    ({"type": "shutdown", "drain": math.inf}, "shutdown.drain"),
    ({"type": "shutdown", "drain": "1"}, "shutdown.drain"),
    ({"type": "generate", "id": "r", "kind": "chat", "max_tokens": 1,
      "logit_bias": {"1": "x"}}, "generate.logit_bias"),
    ({"type": "generate", "id": "r", "kind": "chat", "max_tokens": 1,
      "messages": [{"role": 1}]}, "generate.messages"),
    ({"type": "generate", "id": "r", "kind": "poem", "max_tokens": 1}, "generate.kind"),
    ({"type": "generate", "id": "r", "kind": "chat", "max_tokens": 1, "tool_choice": "any"},
     "generate.tool_choice"),
    ({"type": "generate", "id": "r", "kind": "chat", "max_tokens": 1,
      "tool_choice": "function"}, "generate.tool_name"),
    ({"type": "generate", "id": "r", "kind": "chat", "max_tokens": 1,
      "parallel_tool_calls": 1}, "generate.parallel_tool_calls"),
    ({"type": "generate", "id": "r", "kind": "chat", "max_tokens": 1,
      "tools": [{"x": math.nan}]}, "generate.tools"),
    ({"type": "generate", "id": "r", "kind": "chat", "max_tokens": 1, "stop": "x"},
     "generate.stop"),
    ({"type": "generate", "id": "r", "kind": "chat", "max_tokens": 1, "logprobs": 1},
     "generate.logprobs"),
    ({"type": "generate", "id": "r", "kind": "chat", "max_tokens": 1, "min_p": math.nan},
     "generate.min_p"),
    ({"type": "generate", "id": "r", "kind": "chat", "max_tokens": 1,
      "chat_template_kwargs": [1]}, "generate.chat_template_kwargs"),
    # Content parts only with images, each image placed once, nothing else in a part.
    ({"type": "generate", "id": "r", "kind": "chat", "max_tokens": 1,
      "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]},
     "generate.messages"),
    ({"type": "generate", "id": "r", "kind": "chat", "max_tokens": 1, "images": [{"data": "AA"}],
      "messages": [{"role": "user", "content": "no image placed"}]}, "generate.images: each"),
    ({"type": "generate", "id": "r", "kind": "chat", "max_tokens": 1, "images": [{"data": "AA"}],
      "messages": [{"role": "user", "content": [{"type": "image", "image": 1}]}]},
     "generate.messages[0].content[0].image: no image 1"),
    ({"type": "generate", "id": "r", "kind": "chat", "max_tokens": 1, "images": [{"data": "AA"}],
      "messages": [{"role": "user", "content": [{"type": "image", "image": 0},
                                                {"type": "image", "image": 0}]}]},
     "generate.images: each"),
    ({"type": "generate", "id": "r", "kind": "chat", "max_tokens": 1, "images": [{"data": "AA"}],
      "messages": [{"role": "user", "content": [{"type": "image", "image": 0, "url": "x"}]}]},
     "generate.messages[0].content[0]: not a text or image part"),
    ({"type": "generate", "id": "r", "kind": "chat", "max_tokens": 1, "images": [{"data": 1}]},
     "generate.images"),
    ({"type": "generate", "id": "r", "kind": "chat", "max_tokens": 1,
      "images": [{"data": "A" * (28 * 2**20)}]}, "larger than 20MiB"),
    ({"type": "generate", "id": "r", "kind": "chat", "max_tokens": 1,
      "images": [{"data": "AA"}] * 17}, "more than 16 images"),
    ({"type": "generate", "id": "r", "kind": "chat", "max_tokens": 1, "weight": 0},
     "generate.weight"),
    ({"type": "generate", "id": "r", "kind": "chat", "max_tokens": 1, "priority": "urgent"},
     "priority"),
], ids=lambda v: str(v)[:80])
def test_malformed_to_the_runner(obj: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ProtocolError) as info:
        m.decode_to_runner(obj)
    assert fragment in str(info.value)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=3),
    max_leaves=10,
)
TYPES = st.sampled_from([*m.FROM_RUNNER, *m.TO_RUNNER, "nope"])
FIELDS = st.sampled_from(["id", "text", "loaded", "total", "phase", "version", "pid", "code",
                          "message", "drain", "kind", "max_tokens", "messages", "stop",
                          "finish_reason", "prompt_tokens", "completion_tokens", "reason",
                          "exit_code", "logit_bias", "seed", "prompt", "attempt", "active"])


@settings(max_examples=400, deadline=None)
@given(kind=TYPES, fields=st.dictionaries(FIELDS, JSON, max_size=6))
def test_any_object_is_a_message_or_a_protocol_error(kind: str, fields: dict[str, Any]) -> None:
    obj = {"type": kind, **fields}
    for decode in (m.decode_from_runner, m.decode_to_runner):
        try:
            msg = decode(obj)
        except ProtocolError:
            continue
        # What passed the check is exactly what goes back on the wire.
        assert json.loads(json.dumps(m.to_wire(msg))) == m.to_wire(msg)
