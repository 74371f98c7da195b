"""The sampling set, logprobs, reasoning and the prompt cache's figure, with the official
`openai` client against real runners: the tokens mlx-lm itself gives for the same settings,
logprobs consistent with the text, a thinking model's reasoning apart from its answer (a think
block opened by the template too), chat_template_kwargs per request and per instance, and no
request field ignored. One daemon serves the module: these tests only read.

mlx-lm's own answers come from tests/integration/sampling_reference.py, in a subprocess: the
test process never imports mlx.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.harness import REPO, Daemon
from tests.models.thinking import make_thinking_model

EOS = "2"  # the tiny model's <|im_end|>: banned, so every answer runs to max_tokens
THINK_END = 1023  # </think> in the thinking model (tests.models.thinking)
HELLO = [{"role": "user", "content": "hello"}]
NO_EOS = {"logit_bias": {EOS: -100}}

# Settings whose answers must be mlx-lm's: penalties alone (greedy), and the sampling filters
# with a seed (exod draws from a key of the request's own; mlx-lm after mx.random.seed).
CASES: list[dict[str, Any]] = [
    {"prompt": "def fibonacci(n):", "repetition_penalty": 1.5, "repetition_context_size": 10},
    {"prompt": "import os", "presence_penalty": 1.5, "frequency_penalty": 0.8},
    {"prompt": "class A:", "temperature": 0.9, "seed": 11, "top_k": 8},
    {"prompt": "x = ", "temperature": 1.2, "seed": 5, "min_p": 0.2, "top_p": 0.9},
    {"prompt": "for i in", "temperature": 1.0, "seed": 3, "top_k": 20, "min_p": 0.05,
     "repetition_penalty": 1.2, "presence_penalty": 0.3, "frequency_penalty": 0.3},
]
CASES = [{"temperature": 0, **c, "max_tokens": 20, **NO_EOS} for c in CASES]
EXTRA = ("top_k", "min_p", "repetition_penalty", "repetition_context_size")  # not in OpenAI's


class Served:
    def __init__(self, d: Daemon, tiny: Path) -> None:
        self.d, self.tiny = d, tiny
        self.client = openai.OpenAI(base_url=d.api_url() + "/v1", api_key="-", max_retries=0,
                                    timeout=120)

    def complete(self, case: dict[str, Any], model: str = "tiny") -> Any:
        extra = {k: case[k] for k in EXTRA if k in case}
        rest = {k: v for k, v in case.items() if k not in EXTRA}
        return self.client.completions.create(model=model, extra_body=extra, **rest)

    def chat(self, model: str = "tiny", messages: list[dict[str, str]] = HELLO,
             **kw: Any) -> Any:
        return self.client.chat.completions.create(model=model, messages=messages,  # type: ignore[arg-type]
                                                   **kw)


@pytest.fixture(scope="module")
def served(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    thinking = make_thinking_model(tiny_model, tmp_path_factory.mktemp("think") / "model")
    d = Daemon({"instances": {
        "tiny": {"model": str(tiny_model), "max_concurrency": 4},
        "think": {"model": str(thinking)},
        "quiet": {"model": str(thinking), "chat_template_kwargs": {"enable_thinking": False}},
    }}, name="sampling")
    try:
        d.start()
        d.watch_until(lambda s: all(i["state"] == "ready" for i in s["instances"]),
                      what="every instance ready")
        yield Served(d, tiny_model)
    finally:
        d.close()


def reference(model: Path, cases: list[dict[str, Any]]) -> dict[str, list[str]]:
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests/integration/sampling_reference.py"), str(model),
         json.dumps(cases)], cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"},
        capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict[str, list[str]] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


# ---- the sampling set ----------------------------------------------------------------------
def test_the_sampling_set_gives_mlx_lms_tokens(served: Served) -> None:
    """Each case alone, then all at once in one batch: mlx-lm's text, token for token; exod's
    turn engine (in the reference's process) gives it too."""
    ref = reference(served.tiny, CASES)
    alone = [served.complete(c).choices[0].text for c in CASES]
    with ThreadPoolExecutor(len(CASES)) as pool:
        together = list(pool.map(lambda c: served.complete(c).choices[0].text, CASES))
    assert alone == ref["mlx"]
    assert together == ref["mlx"]
    assert ref["batch"] == ref["turns"] == ref["mlx"]
    # The settings change the answer: the test cannot pass by ignoring them.
    plain = [served.complete({"prompt": c["prompt"], "max_tokens": 20, "temperature": 0,
                              **NO_EOS}).choices[0].text for c in CASES[:2]]
    assert plain[0] != alone[0] and plain[1] != alone[1]
    assert len(set(alone)) == len(alone)


def test_top_k_1_is_greedy(served: Served) -> None:
    greedy = served.chat(max_tokens=16, temperature=0, **NO_EOS).choices[0].message.content
    for seed in (1, 2, 3):
        sampled = served.chat(max_tokens=16, temperature=1.5, seed=seed, extra_body={"top_k": 1},
                              **NO_EOS).choices[0].message.content
        assert sampled == greedy
    other = served.chat(max_tokens=16, temperature=1.5, seed=1, **NO_EOS).choices[0].message
    assert other.content != greedy  # without top_k the same seed samples something else


# ---- logprobs ------------------------------------------------------------------------------
def joined(entries: list[Any]) -> str:
    return bytes(b for e in entries for b in e.bytes).decode("utf-8", "replace")


def test_logprobs_are_consistent_with_the_text(served: Served) -> None:
    r = served.chat(max_tokens=24, temperature=0, logprobs=True, top_logprobs=5, **NO_EOS)
    choice = r.choices[0]
    entries = choice.logprobs.content
    assert r.usage.completion_tokens == len(entries) == 24
    # The tokens' bytes make the text (the detokenizer may drop a first token's leading space).
    assert joined(entries) in (choice.message.content, " " + choice.message.content)
    for e in entries:
        assert len(e.top_logprobs) == 5 and e.logprob <= 0
        tops = [t.logprob for t in e.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        assert e.logprob == tops[0] and e.bytes == e.top_logprobs[0].bytes  # greedy: the top one
    # Streamed: the same entries, in pieces, alongside the same text.
    chunks = list(served.chat(max_tokens=24, temperature=0, logprobs=True, top_logprobs=5,
                              stream=True, **NO_EOS))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content or []]
    assert [(e.token, e.logprob, e.bytes) for e in streamed] == \
        [(e.token, e.logprob, e.bytes) for e in entries]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
        choice.message.content
    # Without logprobs: none.
    assert served.chat(max_tokens=2, temperature=0).choices[0].logprobs is None


def test_logprobs_are_after_logit_bias_and_sampled_tokens_are_reported(served: Served) -> None:
    """OpenAI's definition: the distribution sampled from, after logit_bias (a token biased by
    +100 has probability ~1), before temperature. A sampled token is the one reported."""
    forced = served.chat(max_tokens=3, temperature=0, logprobs=True,
                         logit_bias={"300": 100}).choices[0]
    assert all(e.logprob > -1e-3 for e in forced.logprobs.content)
    sampled = served.chat(max_tokens=24, temperature=2.0, seed=9, logprobs=True, top_logprobs=1,
                          **NO_EOS).choices[0]
    entries = sampled.logprobs.content
    assert joined(entries) in (sampled.message.content, " " + sampled.message.content)
    assert all(e.logprob <= e.top_logprobs[0].logprob for e in entries)
    assert any(e.logprob < e.top_logprobs[0].logprob for e in entries)  # not all the top one


def test_completions_logprobs_in_the_legacy_shape(served: Served) -> None:
    r = served.client.completions.create(model="tiny", prompt="def f(x):", max_tokens=12,
                                         temperature=0, logprobs=3, **NO_EOS)
    choice = r.choices[0]
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 12
    assert all(len(t) <= 3 and max(t.values()) == v
               for t, v in zip(lp.top_logprobs, lp.token_logprobs, strict=True))
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(12)]
    assert "".join(lp.tokens).lstrip(" ") == choice.text.lstrip(" ") or "\ufffd" in choice.text
    streamed = list(served.client.completions.create(
        model="tiny", prompt="def f(x):", max_tokens=12, temperature=0, logprobs=3, stream=True,
        **NO_EOS))
    assert [t for c in streamed if c.choices[0].logprobs
            for t in c.choices[0].logprobs.tokens] == lp.tokens


# ---- reasoning and chat_template_kwargs -----------------------------------------------------
def test_a_think_block_opened_by_the_template_is_reasoning(served: Served) -> None:
    r = served.chat("think", max_tokens=12, temperature=0, **NO_EOS)
    message = r.choices[0].message
    assert message.content == ""
    assert message.reasoning_content and len(message.reasoning_content) > 5  # type: ignore[attr-defined]
    # Every token was reasoning: usage says so, as OpenAI's does for its reasoning models.
    assert r.usage is not None and r.usage.completion_tokens_details is not None
    assert r.usage.completion_tokens_details.reasoning_tokens == r.usage.completion_tokens == 12


def test_enable_thinking_per_request_and_per_instance(served: Served) -> None:
    quiet = served.chat("quiet", max_tokens=12, temperature=0, **NO_EOS).choices[0].message
    asked = served.chat("think", max_tokens=12, temperature=0,
                        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
                        **NO_EOS).choices[0].message
    assert quiet.content and getattr(quiet, "reasoning_content", None) is None
    assert asked.content == quiet.content
    # The request's own kwargs win over the instance's.
    loud = served.chat("quiet", max_tokens=12, temperature=0,
                       extra_body={"chat_template_kwargs": {"enable_thinking": True}},
                       **NO_EOS).choices[0].message
    assert loud.content == "" and loud.reasoning_content  # type: ignore[attr-defined]


def test_reasoning_then_answer_split_at_the_marker(served: Served) -> None:
    """A bias on `</think>` that makes the model close its block part-way (found by looking
    at the raw completion, which shows the marker): the chat answer's reasoning is what came
    before it, its content what came after, whole and streamed."""
    prompt = ("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n<think>\n")
    raw = ""
    for tenth in range(10, 40):
        bias = {EOS: -100, str(THINK_END): tenth / 10}
        raw = served.client.completions.create(model="think", prompt=prompt, max_tokens=16,
                                               temperature=0, presence_penalty=2.0,
                                               logit_bias=bias).choices[0].text
        before, _, after = raw.partition("</think>")
        if before and after and "</think>" not in after:
            break
    else:
        pytest.fail(f"no bias closes the block part-way: {raw!r}")
    kw: dict[str, Any] = {"max_tokens": 16, "temperature": 0, "presence_penalty": 2.0,
                          "logit_bias": bias}
    whole = served.chat("think", **kw)
    message = whole.choices[0].message
    assert (message.reasoning_content, message.content) == (before, after)  # type: ignore[attr-defined]
    # The reasoning's tokens, the closing marker among them, and not the answer's.
    assert whole.usage is not None and whole.usage.completion_tokens_details is not None
    thought = whole.usage.completion_tokens_details.reasoning_tokens
    assert thought is not None and 1 < thought < whole.usage.completion_tokens, whole.usage
    chunks = [c.choices[0].delta for c in served.chat("think", stream=True, **kw) if c.choices]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in chunks) == before
    assert "".join(d.content or "" for d in chunks) == after


# ---- the prompt cache ------------------------------------------------------------------------
def test_cached_tokens_come_from_the_prompt_cache(served: Served) -> None:
    first = served.chat(messages=[{"role": "user", "content": "a question about caching"}],
                        max_tokens=8, temperature=0, **NO_EOS)
    turn = [{"role": "user", "content": "a question about caching"},
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "and another"}]
    second = served.chat(messages=turn, max_tokens=4, temperature=0, **NO_EOS)
    # The first shares only the template's opening with earlier chats; the second turn starts
    # from the first whole (its prompt at least, the answer as re-tokenized may differ).
    assert first.usage.prompt_tokens_details.cached_tokens < 8
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens <= cached < second.usage.prompt_tokens
    streamed = list(served.chat(messages=turn, max_tokens=4, temperature=0, stream=True,
                                stream_options={"include_usage": True}, **NO_EOS))
    # The same turn again: all of it but the last token, which must run again for its logits.
    assert streamed[-1].usage.prompt_tokens_details.cached_tokens == \
        second.usage.prompt_tokens - 1


# ---- nothing silently ignored ----------------------------------------------------------------
@pytest.mark.parametrize("field, value", [
    ("n", 2), ("ignore_eos", True), ("audio", {"voice": "alloy", "format": "mp3"}),
    ("modalities", ["text", "audio"]), ("reasoning_effort", "high"), ("verbosity", "low"),
    ("web_search_options", {}), ("functions", [{"name": "f"}]), ("moderation", {"model": "x"}),
])
def test_fields_exod_does_not_serve_are_refused_by_name(served: Served, field: str,
                                                        value: Any) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        served.chat(max_tokens=1, extra_body={field: value})
    assert e.value.body["param"] == field, e.value.body  # type: ignore[index]


def test_fields_that_cannot_change_the_answer_are_accepted(served: Served) -> None:
    plain = served.chat(max_tokens=6, temperature=0, **NO_EOS).choices[0].message.content
    r = served.chat(max_tokens=6, temperature=0, user="u", metadata={"k": "v"}, store=False,
                    safety_identifier="s", service_tier="auto", prompt_cache_key="k",
                    modalities=["text"], stream_options=None,
                    prediction={"type": "content", "content": "x"}, **NO_EOS)
    assert r.choices[0].message.content == plain
    with pytest.raises(openai.BadRequestError) as e:
        served.client.completions.create(model="tiny", prompt="x", max_tokens=1, suffix="y")
    assert e.value.body["param"] == "suffix"  # type: ignore[index]


# ---- hostile values --------------------------------------------------------------------------
HOSTILE: list[tuple[str, dict[str, Any], str | None]] = [
    ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("chat", {"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ("chat", {"top_logprobs": 5}, "top_logprobs"),  # without logprobs
    ("chat", {"logprobs": True, "top_logprobs": 10**30}, "top_logprobs"),
    ("completion", {"logprobs": 10**9}, "logprobs"),
    ("chat", {"presence_penalty": "NaN"}, "presence_penalty"),
    ("chat", {"frequency_penalty": "-Infinity"}, "frequency_penalty"),
    ("chat", {"repetition_penalty": -1.0}, "repetition_penalty"),
    ("chat", {"repetition_penalty": 0}, "repetition_penalty"),
    ("chat", {"repetition_penalty": "1e999"}, "repetition_penalty"),
    ("completion", {"min_p": "NaN"}, "min_p"),
    ("completion", {"top_k": 10**40}, "top_k"),
    ("completion", {"repetition_context_size": 10**12}, "repetition_context_size"),
    ("chat", {"chat_template_kwargs": {"chat_template": "{% for i in range(10**9) %}x"
                                                        "{% endfor %}"}}, "chat_template_kwargs"),
    ("chat", {"chat_template_kwargs": {"deep": "DEEP"}}, None),  # the body's own JSON check
    ("chat", {"chat_template_kwargs": {"k": "x" * 100_000}}, "chat_template_kwargs"),
]


@pytest.mark.timing  # each answer within 5 s
def test_hostile_values_get_a_4xx_within_seconds(served: Served) -> None:
    """Raw HTTP (NaN and infinities as JSON numbers, as Python's json writes them), each answered
    with a 400 naming the field, fast; the instance serves on."""
    url = served.d.api_url()
    host, port = url.removeprefix("http://").split(":")
    for endpoint, fields, param in HOSTILE:
        body = {"model": "tiny", "max_tokens": 4, **fields}
        body.update({"messages": HELLO} if endpoint == "chat" else {"prompt": "x"})
        raw = json.dumps(body).replace('"NaN"', "NaN").replace('"-Infinity"', "-Infinity") \
            .replace('"1e999"', "1e999").replace('"DEEP"', "[" * 5000 + "]" * 5000)
        path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        t0 = time.monotonic()
        conn.request("POST", path, raw.encode(), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        answer = json.loads(resp.read())
        took = time.monotonic() - t0
        conn.close()
        assert resp.status == 400, (fields, resp.status, answer)
        assert answer["error"]["param"] == param, (fields, answer)
        assert took < 5, (fields, took)
    assert served.chat(max_tokens=2, temperature=0).choices[0].finish_reason
