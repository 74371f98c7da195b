"""Each key's limits through real daemons, with the official clients of every dialect (openai:
chat, completions, Responses; anthropic: Messages; ollama: chat, generate): requests in flight,
prompt and completion tokens per minute, and a daily quota used up, kept across a restart and
reset with the UTC day. Each refusal is checked for its status, its headers and its body in
the dialect's own shape. A stream under way is never cut by a limit: it ends as it would.

Time is never waited for: per-minute buckets are checked as refused (their refill is
tests/unit/test_key_limits.py's, on an injected clock), and a quota's reset is made by moving
the usage log's records back before the day the refusal named, as the day's passing would,
then starting the daemon again (which rebuilds its quotas from that log)."""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import httpx2
import ollama
import openai
import pytest

from exod.core.keys import hash_text
from tests.harness import Daemon
from tests.integration.conftest import double_env

EOS = "2"  # the tiny model's <|im_end|>: biased away, so every answer runs to max_tokens
ASK = [{"role": "user", "content": "hello there"}]
KEYS: dict[str, dict[str, Any]] = {
    "one": {"in_flight": 1},
    "ptpm": {"prompt_tokens_per_minute": 5},
    "ctpm": {"completion_tokens_per_minute": 4},
    "daily": {"tokens_per_day": 40},
    "embed": {"prompt_tokens_per_minute": 5},
    "free": {},
}


def secret(name: str) -> str:
    return f"exod-test-secret-of-{name}"


def keys_config(limits: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"name": n, "hash": hash_text(secret(n)), "limits": lim,
             "scopes": ["infer", "admin"] if n == "free" else ["infer"]}
            for n, lim in limits.items()]


class Clients:
    """One key's official clients, retrying nothing unless asked (`retries`)."""

    def __init__(self, url: str, name: str, retries: int = 0,
                 hook: Callable[[httpx2.Request], None] | None = None) -> None:
        self.url, self.name = url, name
        http = httpx2.Client(event_hooks={"request": [hook]}) if hook else None
        self.openai = openai.OpenAI(base_url=url + "/v1", api_key=secret(name),
                                    max_retries=retries, timeout=60)
        self.claude = anthropic.Anthropic(base_url=url, api_key=secret(name),
                                          max_retries=retries, timeout=60, http_client=http)
        self.ollama = ollama.Client(host=url, timeout=60,
                                    headers={"Authorization": f"Bearer {secret(name)}"})

    def chat(self, n: int = 4, model: str = "tiny", **kw: Any) -> Any:
        return self.openai.chat.completions.create(
            model=model, messages=ASK, max_tokens=n, temperature=0,  # type: ignore[arg-type]
            logit_bias={EOS: -100}, **kw)

    def every_dialect(self) -> dict[str, Callable[[], Any]]:
        """One short request in each dialect, by its official client."""
        return {
            "chat": lambda: self.chat(),
            "completions": lambda: self.openai.completions.create(
                model="tiny", prompt="hello", max_tokens=4, temperature=0),
            "responses": lambda: self.openai.responses.create(
                model="tiny", input="hello", max_output_tokens=4, temperature=0),
            "messages": lambda: self.claude.messages.create(
                model="tiny", max_tokens=4, messages=ASK,  # type: ignore[arg-type]
                extra_body={"temperature": 0}),
            "ollama_chat": lambda: self.ollama.chat(model="tiny", messages=ASK,
                                                    options={"num_predict": 4}),
            "ollama_generate": lambda: self.ollama.generate(model="tiny", prompt="hello",
                                                            options={"num_predict": 4}),
        }


def refusals(c: Clients) -> dict[str, tuple[int, dict[str, str], Any]]:
    """(status, headers, error body or text) of each dialect's request, each refused."""
    out: dict[str, tuple[int, dict[str, str], Any]] = {}
    for dialect, call in c.every_dialect().items():
        try:
            call()
        except (openai.APIStatusError, anthropic.APIStatusError) as e:
            out[dialect] = (e.status_code, dict(e.response.headers), e.body)
        except ollama.ResponseError as e:
            out[dialect] = (e.status_code, {}, e.error)
        else:
            raise AssertionError(f"{dialect}: not refused")
    return out


def check_shapes(got: dict[str, tuple[int, dict[str, str], Any]], status: int, openai_type: str,
                 code: str, anthropic_status: int, anthropic_type: str, words: str) -> None:
    """Each dialect's refusal in its own shape, the same words in each."""
    for dialect, (st, headers, body) in got.items():
        if dialect == "messages":
            assert st == anthropic_status, (dialect, body)
            assert body == {"type": "error", "error": {"type": anthropic_type,
                                                       "message": body["error"]["message"]}}
            assert words in body["error"]["message"]
        elif dialect.startswith("ollama"):
            assert st == status and isinstance(body, str) and words in body, (dialect, body)
        else:
            assert st == status, (dialect, body)
            assert (body["type"], body["code"]) == (openai_type, code), body
            assert words in body["message"]
        if not dialect.startswith("ollama"):
            assert int(headers["retry-after"]) >= 1


@pytest.fixture(scope="module")
def limits(tiny_model: Path, embed_zoo: Path, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Daemon]:
    chatty = tmp_path_factory.mktemp("chatty")
    (chatty / "config.json").write_text('{"model_type": "llama", "num_hidden_layers": 4}')
    d = Daemon({"api": {"listen": "127.0.0.1:0", "keys": keys_config(KEYS)},
                "instances": {"tiny": {"model": str(tiny_model), "max_concurrency": 4},
                              "embed": {"model": str(embed_zoo / "bert")},
                              "chatty": {"model": str(chatty),
                                         "env": double_env("chatty")}}}, name="limits")
    try:
        d.start()
        d.watch_until(lambda s: all(i["state"] == "ready" for i in s["instances"]),
                      what="every instance ready")
        yield d
    finally:
        d.close()


def in_flight(d: Daemon, key: str) -> float:
    metrics = httpx.get(d.api_url() + "/metrics", timeout=30,
                        headers={"Authorization": f"Bearer {secret('free')}"}).text
    line = f'exod_key_requests_in_flight{{key="{key}"}} '
    return next((float(x[len(line):]) for x in metrics.splitlines() if x.startswith(line)), 0.0)


def test_requests_in_flight_are_limited_in_every_dialect(limits: Daemon) -> None:
    url = limits.api_url()
    one = Clients(url, "one")
    stop, started = threading.Event(), threading.Event()

    def hold() -> None:  # a stream that goes on until the test has done
        with httpx.stream("POST", url + "/v1/chat/completions", timeout=60,
                          headers={"Authorization": f"Bearer {secret('one')}"},
                          json={"model": "chatty", "messages": ASK, "stream": True}) as r:
            assert r.status_code == 200
            for _ in r.iter_bytes():
                started.set()
                if stop.is_set():
                    return

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert started.wait(60)
        got = refusals(one)
        check_shapes(got, 429, "requests", "rate_limit_exceeded", 429, "rate_limit_error",
                     "1 request(s) in flight")
        assert got["chat"][1]["retry-after"] == "1"
        Clients(url, "free").chat()  # another key is not held back
    finally:
        stop.set()
        holder.join(60)
    limits.watch_until(lambda _: in_flight(limits, "one") == 0, what="the stream ended")
    assert one.chat().choices[0].finish_reason == "length"  # room again


def test_embeddings_spend_prompt_tokens_and_are_limited_as_generations(limits: Daemon
                                                                      ) -> None:
    c = Clients(limits.api_url(), "embed")
    first = c.openai.embeddings.create(model="embed", input=["hello there, in a few words"])
    assert first.usage.prompt_tokens > 5  # let in with a full bucket, which it empties
    with pytest.raises(openai.RateLimitError) as refused:
        c.openai.embeddings.create(model="embed", input="hi")
    assert "5 prompt tokens per minute" in refused.value.message
    assert int(refused.value.response.headers["retry-after"]) >= 1
    with pytest.raises(ollama.ResponseError) as by_ollama:
        c.ollama.embed(model="embed", input="hi")
    assert by_ollama.value.status_code == 429
    free = Clients(limits.api_url(), "free")
    assert free.openai.embeddings.create(model="embed", input="hi").data  # not held back


def test_prompt_tokens_per_minute_in_every_dialect(limits: Daemon) -> None:
    c = Clients(limits.api_url(), "ptpm")
    first = c.chat(6)  # let in with a full bucket; its prompt takes the bucket below zero
    assert first.usage is not None and first.usage.prompt_tokens > 5
    got = refusals(c)
    check_shapes(got, 429, "tokens", "rate_limit_exceeded", 429, "rate_limit_error",
                 "5 prompt tokens per minute")
    for dialect, (_, headers, _body) in got.items():
        if dialect.startswith("ollama"):
            continue
        assert headers["x-ratelimit-limit-tokens"] == "5"
        assert headers["x-ratelimit-remaining-tokens"] == "0"
        assert headers["x-ratelimit-reset-tokens"].endswith("s")
        assert headers["anthropic-ratelimit-input-tokens-limit"] == "5"
        # In debt by the prompt's tokens past the five: a refill of 5 a minute.
        assert int(headers["retry-after"]) >= 12 * (first.usage.prompt_tokens - 5)


def test_a_stream_is_never_cut_by_a_per_minute_limit_the_next_request_waits(
        limits: Daemon) -> None:
    c = Clients(limits.api_url(), "ctpm")
    with c.claude.messages.stream(model="tiny", max_tokens=24, messages=ASK,  # type: ignore[arg-type]
                                  extra_body={"temperature": 0,
                                              "logit_bias": {EOS: -100}}) as s:
        final = s.get_final_message()
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 24  # all of it
    with pytest.raises(anthropic.RateLimitError) as e:
        c.claude.messages.create(model="tiny", max_tokens=4, messages=ASK)  # type: ignore[arg-type]
    h = e.value.response.headers
    assert h["anthropic-ratelimit-output-tokens-limit"] == "4"
    assert h["anthropic-ratelimit-output-tokens-remaining"] == "0"
    assert h["x-ratelimit-limit-tokens"] == "4"
    assert "4 completion tokens per minute" in e.value.body["error"]["message"]  # type: ignore[index]


# ---- a quota ---------------------------------------------------------------------------------
def next_midnight() -> str:
    now = dt.datetime.now(dt.timezone.utc)
    return (dt.datetime(now.year, now.month, now.day, tzinfo=dt.timezone.utc)
            + dt.timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_quota_used_up_is_kept_across_a_restart_and_resets_with_the_day(
        daemons: Any, tiny_model: Path) -> None:
    d = daemons({"api": {"listen": "127.0.0.1:0", "keys": keys_config(KEYS)},
                 "instances": {"tiny": {"model": str(tiny_model)}}}, name="quota")
    d.start()
    d.until_state("tiny", "ready")
    c = Clients(d.api_url(), "daily")
    r = c.chat(40)  # under the quota when it starts; past it when it ends, and not cut
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 40
    midnight = next_midnight()
    got = refusals(c)
    check_shapes(got, 429, "insufficient_quota", "insufficient_quota", 529, "overloaded_error",
                 "quota of 40 tokens per day")
    for dialect, (_, headers, body) in got.items():
        text = body if isinstance(body, str) else (body.get("message") or body["error"]["message"])
        assert midnight in text, text  # when it resets
        if not dialect.startswith("ollama"):
            assert headers["x-should-retry"] == "false"
            assert headers["x-exod-quota-reset"] == midnight
    # The official clients' own retries (two by default) leave a quota alone.
    sent: list[httpx2.Request] = []
    retrying = Clients(d.api_url(), "daily", retries=2, hook=sent.append)
    with pytest.raises(anthropic.InternalServerError) as e:
        retrying.claude.messages.create(model="tiny", max_tokens=4, messages=ASK)  # type: ignore[arg-type]
    assert e.value.status_code == 529 and len(sent) == 1
    with pytest.raises(openai.RateLimitError):
        retrying.chat()

    d.terminate()  # a restart keeps it: the quota is rebuilt from the usage log
    d.start()
    d.until_state("tiny", "ready")
    with pytest.raises(openai.RateLimitError):
        Clients(d.api_url(), "daily").chat()
    Clients(d.api_url(), "free").chat()  # another key's day is its own

    d.terminate()  # the day passes: every record of today becomes yesterday's
    logs = sorted((d.dir / "state" / "exod" / "usage").glob("usage-*.jsonl"))
    for log in logs:
        lines = [json.loads(x) for x in log.read_text().splitlines()]
        for x in lines:
            x["time"] = (dt.datetime.fromisoformat(x["time"].replace("Z", "+00:00"))
                         - dt.timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    d.start()
    d.until_state("tiny", "ready")
    assert Clients(d.api_url(), "daily").chat().choices[0].finish_reason == "length"
