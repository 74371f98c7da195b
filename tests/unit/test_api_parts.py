"""The HTTP API's pure parts: request validation, response objects and SSE framing, listen
addresses, and the runner's stop-sequence matcher. No processes, no sockets, no mlx. (The
admission gate is the daemon's: tests/unit/test_traffic.py.)"""

from __future__ import annotations

import json

import pytest

from exod.wire import messages as m
from exod.wire.messages import Generate, decode_to_runner, to_wire

from exod.core import listen as address
from exod.api.errors import ApiError
from exod.api import sse
from exod.api.dialects.openai.objects import ChatObjects
from exod.api.reply import Finished, Reply, Usage
from exod.api.dialects.openai.request import parse_chat, parse_completion
from exod.runner.serving.stop_sequences import StopMatcher


# ---- stop sequences ---------------------------------------------------------------------------
def run_stops(stops: list[str], pieces: list[str]) -> tuple[str, bool]:
    m = StopMatcher(stops)
    out = "".join(m.feed(p) for p in pieces)
    if not m.stopped:
        out += m.flush()
    return out, m.stopped


@pytest.mark.parametrize("stops, pieces, text, stopped", [
    ([], ["ab", "cd"], "abcd", False),
    (["X"], ["abXcd"], "ab", True),
    (["END"], ["ab", "E", "N", "D", "more"], "ab", True),  # spans three pieces
    (["END"], ["ab", "EN", "x"], "abENx", False),  # a false start is released
    (["END"], ["abEN"], "abEN", False),  # generation ended on a partial match: flushed
    (["xy", "b"], ["axyb"], "a", True),  # the earliest of several wins
    (["\n\n"], ["one\n", "\ntwo"], "one", True),
])
def test_stop_matcher(stops: list[str], pieces: list[str], text: str, stopped: bool) -> None:
    assert run_stops(stops, pieces) == (text, stopped)


def test_stop_matcher_holds_back_only_a_possible_start() -> None:
    m = StopMatcher(["STOP"])
    assert m.feed("hello S") == "hello "  # "S" may start STOP
    assert m.feed("T") == ""
    assert m.feed("x") == "STx"
    assert m.feed("ST") == ""
    assert m.feed("OP and more") == ""
    assert m.stopped and m.feed("after") == "" and m.flush() == ""


# ---- request validation ---------------------------------------------------------------------
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_chat_defaults_and_runner_message() -> None:
    req = parse_chat(CHAT)
    g = req.gen
    assert (g.kind, req.model, g.max_tokens, g.temperature, g.top_p) == \
        ("chat", "m", 1024, 1.0, 1.0)
    assert not req.stream and not req.include_usage and g.stop == []
    msg = req.gen
    assert msg == Generate(id="", kind="chat", max_tokens=1024, temperature=1.0, top_p=1.0,
                           stop=[], logit_bias={},
                           messages=[{"role": "user", "content": "hi"}])
    # It goes over the channel as JSON, and passes the runner's own check.
    assert decode_to_runner(json.loads(json.dumps(to_wire(msg)))) == msg


def test_chat_fields() -> None:
    req = parse_chat({**CHAT, "max_completion_tokens": 7, "temperature": 0, "top_p": 0.5,
                      "stop": "\n", "seed": 3, "stream": True,
                      "stream_options": {"include_usage": True}, "logit_bias": {"2": -100},
                      "user": "ignored", "frequency_penalty": 0})
    g = req.gen
    assert (g.max_tokens, g.temperature, g.top_p, g.stop, g.seed) == (7, 0.0, 0.5, ["\n"], 3)
    assert req.stream and req.include_usage and g.logit_bias == {"2": -100.0}


def test_chat_content_parts_and_developer_role() -> None:
    req = parse_chat({"model": "m", "messages": [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None}]})
    assert req.gen.messages == [{"role": "system", "content": "be brief"},
                            {"role": "user", "content": "ab"},
                            {"role": "assistant", "content": ""}]


@pytest.mark.parametrize("body, param", [
    ([], None),
    ({"messages": CHAT["messages"]}, "model"),
    ({"model": "m"}, "messages"),
    ({"model": "m", "messages": ["hi"]}, "messages[0]"),
    ({"model": "m", "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({**CHAT, "max_tokens": 0}, "max_tokens"),
    ({**CHAT, "max_completion_tokens": "9"}, "max_completion_tokens"),
    ({**CHAT, "temperature": 2.5}, "temperature"),
    ({**CHAT, "top_p": -1}, "top_p"),
    ({**CHAT, "stop": 5}, "stop"),
    ({**CHAT, "seed": 1.5}, "seed"),
    ({**CHAT, "n": 2}, "n"),
    ({**CHAT, "max_completion_tokens": 2, "max_tokens": -5}, "max_tokens"),
    ({**CHAT, "stream": "yes"}, "stream"),
    ({**CHAT, "stream_options": {"include_usage": True}}, "stream_options"),
    ({**CHAT, "logit_bias": {"a": 1}}, "logit_bias"),
])
def test_chat_rejects_with_400_naming_the_param(body: object, param: str | None) -> None:
    """Each field reaches its rule (exod.core.request_rules, tested one by one in
    test_request_rules), and a broken rule is a 400 in OpenAI's shape naming it."""
    with pytest.raises(ApiError) as e:
        parse_chat(body)
    assert e.value.status == 400 and e.value.type == "invalid_request_error"
    assert e.value.param == param
    assert set(e.value.body()["error"]) == {"message", "type", "param", "code"}


def test_a_null_max_completion_tokens_is_a_field_not_set() -> None:
    req = parse_chat({**CHAT, "max_completion_tokens": None, "max_tokens": 2})
    assert req.gen.max_tokens == 2 and req.gen.named("max_tokens") == "max_tokens"
    req = parse_chat({**CHAT, "max_completion_tokens": 3, "max_tokens": 9})
    assert req.gen.max_tokens == 3 and req.gen.named("max_tokens") == "max_completion_tokens"


def test_completion_prompt_forms() -> None:
    assert parse_completion({"model": "m", "prompt": "x"}).gen.prompt == "x"
    assert parse_completion({"model": "m", "prompt": ["x"]}).gen.prompt == "x"
    assert parse_completion({"model": "m", "prompt": "x"}).gen.max_tokens == 16
    for bad in ({"model": "m"}, {"model": "m", "prompt": ["a", "b"]},
                {"model": "m", "prompt": "x", "echo": True}):
        with pytest.raises(ApiError):
            parse_completion(bad)


# ---- response objects and SSE framing ----------------------------------------------------------
def test_chat_chunks_share_id_created_model() -> None:
    r = ChatObjects("chat", "m", include_usage=True)
    first, piece, last = r.chunk(role=True), r.chunk("hi"), r.chunk(finish_reason="stop")
    assert r.id.startswith("chatcmpl-")
    for c in (first, piece, last):
        assert (c["id"], c["created"], c["model"], c["object"]) == \
            (r.id, r.created, "m", "chat.completion.chunk")
        assert c["usage"] is None and len(c["choices"]) == 1
        assert c["choices"][0]["index"] == 0 and c["choices"][0]["logprobs"] is None
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert piece["choices"][0] == {"index": 0, "delta": {"content": "hi"}, "logprobs": None,
                                   "finish_reason": None}
    assert last["choices"][0]["delta"] == {} and last["choices"][0]["finish_reason"] == "stop"
    u = r.usage_chunk(Usage(3, 4, reasoning=2))
    assert u["choices"] == [] and u["usage"] == {
        "prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 2}}
    assert "usage" not in ChatObjects("chat", "m").chunk("x")  # only with include_usage


def test_sse_framing() -> None:
    raw = sse.frame({"a": "é\n"})
    assert raw.startswith(b"data: ") and raw.endswith(b"\n\n")
    assert raw.count(b"\n") == 2  # JSON escapes newlines: one event is one data line
    assert json.loads(raw[6:]) == {"a": "é\n"}
    assert sse.DONE == b"data: [DONE]\n\n"
    # Messages and Responses name each event on a line of its own, before its data.
    named = sse.frame({"type": "ping"}, "ping")
    assert named == b'event: ping\ndata: {"type":"ping"}\n\n'


def test_whole_objects() -> None:
    chat = ChatObjects("chat", "m").whole(Reply("Paris.", Finished.of(m.Done("r", "stop", 10, 3))))
    assert chat["object"] == "chat.completion"
    assert chat["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "Paris.",
                                                        "refusal": None},
                                "logprobs": None, "finish_reason": "stop"}]
    assert chat["usage"]["total_tokens"] == 13
    text = ChatObjects("completion", "m").whole(Reply("x", Finished.of(m.Done("r", "length", 1,
                                                                           1))))
    assert text["object"] == "text_completion" and text["id"].startswith("cmpl-")
    assert text["choices"][0]["text"] == "x"


# ---- addresses ---------------------------------------------------------------------------------
def test_listen_addresses() -> None:
    assert address.parse_listen("127.0.0.1:52415") == ("127.0.0.1", 52415)
    assert address.parse_listen("[::1]:8000") == ("::1", 8000)
    assert address.url("0.0.0.0", 80) == "http://127.0.0.1:80"
    assert address.url("::", 80) == "http://[::1]:80"
    for bad in ("52415", "host:", ":80", "h:99999", "h:x"):
        with pytest.raises(ValueError):
            address.parse_listen(bad)


def test_aiohttp_s_log_is_an_error_only_for_exod_s_own_faults() -> None:
    """A connection the client reset mid-answer is its doing (debug), as a malformed request
    is; another exception in a handler is exod's (error)."""
    import logging

    from exod.api.httplog import quiet_logger

    seen: list[tuple[str, str]] = []

    class Log:
        def log(self, level: str, cause: str, message: str, *args: object) -> bool:
            seen.append((level, message.format(*args)))
            return True

    logger = quiet_logger(Log())  # type: ignore[arg-type]
    for exc in (ConnectionResetError(104, "Connection reset by peer"), BrokenPipeError(),
                KeyError("x")):
        try:
            raise exc
        except Exception:
            logger.log(logging.ERROR, "Error handling request from %s", "127.0.0.1",
                       exc_info=True)
    assert [level for level, _ in seen] == ["DEBUG", "DEBUG", "ERROR"], seen
    assert "ConnectionResetError" in seen[0][1]


def test_the_runner_is_told_whose_request_it_is_and_its_share() -> None:
    from exod.api.serving import keyed
    from exod.core.keys import ANONYMOUS, ApiKey

    gen = Generate(id="r", kind="completion", max_tokens=1, prompt="x")
    night = keyed(gen, ApiKey("night", weight=0.5, priority="batch"))
    assert (night.key, night.weight, night.priority) == ("night", 0.5, "batch")
    anyone = keyed(gen, ANONYMOUS)
    assert (anyone.key, anyone.weight, anyone.priority) == ("anonymous", 1.0, "interactive")
