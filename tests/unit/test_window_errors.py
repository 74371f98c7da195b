"""A prompt past the context window: the runner's refusal (exod.core.request_rules.fit_window,
sent with its numbers: exod.wire.messages' `Error`), answered in each dialect's shape, in the words
each one's clients act on (exod.api.window_errors): Claude Code's regular expression, OpenAI's
`context_length_exceeded` that Codex tests, Ollama's own text."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from exod.wire import messages as m
from exod.api.dialects.anthropic.output import AnthropicOutput, usage
from exod.api.dialects.ollama.output import OllamaOutput
from exod.api.dialects.responses.output import ResponsesOutput
from exod.api.reply import Usage
from exod.api.errors import ApiError, runner_error
from exod.api.middleware import error_response
from exod.core import request_rules as rules

# Claude Code 2.1.332 matches its API errors against this (and reads both numbers from it, to
# know how much to compact): the expression as its binary holds it.
CLAUDE_CODE = re.compile(r"^prompt is too long: \d+ tokens > \d+ maximum$")


def refused(prompt: int, window: int, param: str, what: str = rules.MODEL_WINDOW) -> m.Error:
    """What the runner sends: fit_window's refusal, its numbers with it (exod.runner.serving.
    loop)."""
    with pytest.raises(rules.WindowExceeded) as e:
        rules.fit_window(prompt, 100, window, param, what)
    assert e.value.param == param
    return m.Error("r", "context_length_exceeded", str(e.value), param, e.value.prompt,
                   e.value.window, e.value.own)


def answer(err: ApiError, path: str) -> tuple[int, Any]:
    resp = error_response(err, path)
    assert resp.body is not None and resp.content_type == "application/json"
    return resp.status, json.loads(resp.body)  # type: ignore[arg-type]


def data(stream: bytes) -> list[Any]:
    """The JSON of each `data:` line of a piece of a server-sent event stream."""
    return [json.loads(line[len("data: "):]) for line in stream.decode().splitlines()
            if line.startswith("data: ")]


def test_fit_windows_refusal_carries_its_numbers() -> None:
    assert (refused(23110, 4096, "messages").prompt_tokens, refused(23110, 4096, "messages")
            .window) == (23110, 4096)
    assert refused(4096, 4096, "messages").window == 4096  # a full window leaves no room
    own = refused(900, 512, "options.num_ctx", "`options.num_ctx`")
    assert (own.prompt_tokens, own.window, own.own_window) == (900, 512, True)
    m.from_wire(m.to_wire(own), m.FROM_RUNNER)  # as the wire carries it


def test_a_prompt_that_fits_is_never_cut() -> None:
    assert rules.fit_window(4095, 100, 4096, "messages") == 1  # the answer gets what is left


def test_anthropic_says_what_claude_code_matches() -> None:
    err = runner_error(refused(23110, 4096, "messages"))
    status, body = answer(err, "/v1/messages")
    assert status == 400
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    message = body["error"]["message"]
    assert CLAUDE_CODE.match(message), message
    # The longest prompt the window takes: one position is kept for the answer.
    assert message == "prompt is too long: 23110 tokens > 4095 maximum"


def test_chat_completions_say_openais_words_and_code() -> None:
    err = runner_error(refused(5000, 4096, "messages"))
    status, body = answer(err, "/v1/chat/completions")
    assert status == 400
    e = body["error"]
    assert (e["type"], e["code"], e["param"]) == \
        ("invalid_request_error", "context_length_exceeded", "messages")
    assert "maximum context length is 4096 tokens" in e["message"]
    assert "resulted in 5000 tokens" in e["message"]
    prompt = runner_error(refused(600, 512, "prompt"))
    assert "your prompt resulted in 600 tokens" in answer(prompt, "/v1/completions")[1][
        "error"]["message"]


def test_responses_say_openais_words_and_the_code_codex_reads() -> None:
    err = runner_error(refused(18065, 4096, "input"))
    status, body = answer(err, "/v1/responses")
    assert status == 400
    e = body["error"]
    assert (e["code"], e["param"]) == ("context_length_exceeded", "input")
    assert "exceeds the context window" in e["message"] and "18065" in e["message"]


def test_ollama_says_its_own_text() -> None:
    err = runner_error(refused(3000, 2048, "messages"))
    status, body = answer(err, "/api/chat")
    assert status == 400
    assert body["error"].startswith("the input length exceeds the context length: 3000 tokens")
    own = runner_error(refused(900, 512, "options.num_ctx", "`options.num_ctx`"))
    assert own.param == "options.num_ctx" and own.code == "context_length_exceeded"
    text = answer(own, "/api/generate")[1]["error"]
    assert text.startswith("the input length exceeds the context length") and \
        "`options.num_ctx`" in text and "512" in text


def test_any_other_refusal_keeps_its_words() -> None:
    err = runner_error(m.Error("r", "bad_request", "`max_tokens` must be at least 1",
                               "max_tokens"))
    assert (err.status, err.code, err.param) == (400, None, "max_tokens")
    assert answer(err, "/v1/messages")[1]["error"]["message"] == err.message
    assert answer(err, "/api/chat")[1]["error"] == err.message  # names its field already


def test_a_stream_that_fails_so_says_it_in_its_dialect() -> None:
    """The runner refuses before the first byte (a 400, as above); were a stream to fail so
    once started, its last event says the same."""
    err = runner_error(refused(41165, 40960, "messages"))
    (last,) = data(AnthropicOutput("m").failed(err))
    assert last["error"]["message"] == "prompt is too long: 41165 tokens > 40959 maximum"
    *_, failed = data(ResponsesOutput("m", {}).failed(err))
    assert failed["type"] == "response.failed"
    assert failed["response"]["error"]["code"] == "context_length_exceeded"
    ollama = json.loads(OllamaOutput("chat", "m").failed(err))
    assert ollama["error"].startswith("the input length exceeds the context length")


def test_anthropic_usage_counts_a_cached_token_once() -> None:
    """Claude Code adds `input_tokens` and `cache_read_input_tokens` up to know how full its
    window is: the prompt's cached part is in the second only."""
    got = usage(Usage(prompt=30000, completion=5, cached=29000))
    assert got == {"input_tokens": 1000, "output_tokens": 5,
                   "cache_read_input_tokens": 29000, "cache_creation_input_tokens": 0}
    assert usage(Usage(prompt=7, completion=1))["input_tokens"] == 7
