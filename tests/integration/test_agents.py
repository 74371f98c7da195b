"""The agents people point at local servers, against exod, configured exactly as docs/agents.md
shows: Claude Code, Codex CLI and opencode, the newest npm releases (installed by the test
set-up, scripts/agents.sh), and two agent libraries, the OpenAI Agents SDK (over chat
completions and over Responses) and pydantic-ai. Each talks to exod through a recording proxy
on loopback (tests.agents.capture), so a test sees exactly what exod was sent and answered.

The model is tests.models.agent: its weights, with nothing in the request steering them, make
it answer a plain prompt with a fixed text, and call the agent's own shell tool (Claude Code's
Bash, Codex's exec_command, opencode's bash, the libraries' `echo`) when asked to run
`echo exod-tool-ran`, then answer once the tool's output is back. So each session is the real
thing: the agent parses the call from exod's stream, runs its tool, sends the result in its own
format, and prints the model's answer. Tool sessions also run against two format models
(tests.models.formats), which do the same in the formats agents meet most, with their
families' real templates: gpt-oss's harmony (reasoning in the analysis channel, the call in
the commentary channel) and Qwen3-Coder's XML; no marker of either ever reaches an answer.

One daemon serves the module (three instances of one-layer models): tens of CPU-seconds,
most of it the prefill of Claude Code's ~23k-token prompt (12 tools, 30 KB of schemas),
Codex's ~18k and opencode's ~14k (10 tools, 21 KB). An opencode session takes 7-13 s of wall
time on a 2-core machine, most of it opencode's own start (a 180 MB binary), not exod's.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
import yaml

from exod.core.keys import hash_text, new_secret
from tests.agents import clients, matrix
from tests.agents.capture import Recorder, serve
from tests.harness import Daemon
from tests.models.agent import AFTER, COMMAND, PLAIN, TRIGGER, make_agent_model
from tests.models.tiny import with_tool_template

ASK = f"Run `{COMMAND}` in the shell, then tell me what it printed."
HELLO = "Say hello."
MODEL = "agent"
SAFETY = 300.0  # seconds: a bound against hangs; a session takes a few
# The instances a tool session runs against: the json_tools model (tests.models.agent) and the
# format models of the formats agents meet most (tests.models.formats): gpt-oss's harmony and
# Qwen3-Coder's XML, each with its family's real template, tokens and reasoning.
FAMILY = {"harmony": "harmony", "qwen3-coder": "qwen3_coder"}
MODELS = [MODEL, *FAMILY]
FORMAT = {MODEL: "json_tools", **FAMILY}  # each model's column of the matrix (docs/agents.md)
# What no answer may show of each model's format (exod.runner.formats' markup).
MARKUP = {MODEL: ("<tool_call>", "</tool_call>"),
          "harmony": ("<|channel|>", "<|message|>", "<|start|>", "<|end|>", "<|call|>",
                      "<|constrain|>", "<|return|>"),
          "qwen3-coder": ("<tool_call>", "</tool_call>", "<function=", "</function>",
                          "<parameter=", "</parameter>")}


class Served:
    def __init__(self, d: Daemon, tmp: Path) -> None:
        self.d, self.tmp, self.url = d, tmp, d.api_url()
        self.runs = 0

    @contextmanager
    def proxy(self) -> Iterator[tuple[Recorder, str]]:
        """A recording proxy in front of exod: (its record, its base URL)."""
        recorder = Recorder()
        server = serve(recorder, upstream=self.url)
        try:
            yield recorder, f"http://127.0.0.1:{server.server_address[1]}"
        finally:
            server.shutdown()
            server.server_close()

    def agent(self, name: str, prompt: str, model: str = MODEL,
              env: dict[str, str] | None = None) -> tuple[Any, Recorder]:
        """Run agent `name` (tests.agents.clients.RUNS) once against instance `model`, in a
        home and a working folder of its own, its environment with `env` over it: (its
        completed process, what went through the proxy)."""
        binary = clients.BIN / {"claude-code": "claude", "codex": "codex",
                                "opencode": "opencode"}[name]
        assert binary.exists(), (f"{binary} is missing: the test set-up installs the agents "
                                 "(make setup-test, or scripts/agents.sh)")
        self.runs += 1
        work = self.tmp / f"{name}-{self.runs}"
        (work / "home").mkdir(parents=True)
        (work / "cwd").mkdir()
        with self.proxy() as (recorder, url):
            run = clients.RUNS[name](url, model, prompt, work / "home", work / "cwd")
            run = replace(run, env={**run.env, **(env or {})})
            proc = run(timeout=SAFETY)
        return proc, recorder


@pytest.fixture(scope="module")
def served(tiny_model: Path, format_models: dict[str, Path],
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("agents")
    model = make_agent_model(with_tool_template(tiny_model, tmp / "tools"), tmp / "agent")
    d = Daemon({"ready": "instances", "instances": {
        MODEL: {"model": str(model)},
        **{name: {"model": str(format_models[family])} for name, family in FAMILY.items()}}})
    try:
        d.start()
        yield Served(d, tmp)
    finally:
        d.close()


def no_markup(model: str, reqs: list[dict[str, Any]]) -> None:
    """No answer shows a marker of the model's format: text, reasoning or arguments."""
    for r in reqs:
        shown = [m for m in MARKUP[model] if m in (r.get("response") or "")]
        assert not shown, (model, shown, r.get("response", "")[:2000])


def observed(agent: str, model: str, reqs: list[dict[str, Any]]) -> None:
    """The matrix's cell (tests.agents.matrix): the session passed, its streamed answers read
    for markup, and the least share of a turn's prompt the next one reused from the cache."""
    answers = [r.get("response") or "" for r in reqs]
    matrix.saw(agent, FORMAT[model], session=True, answers=len(answers),
               leaks=matrix.leaks(MARKUP[model], answers))
    floor = matrix.reuse_floor(reqs)
    if floor is not None:
        matrix.saw(agent, FORMAT[model], reuse_floor=floor)


def model_requests(recorder: Recorder, path_end: str) -> list[dict[str, Any]]:
    return [r for r in recorder.requests if r["path"].endswith(path_end)]


def streamed_all_the_way(recorder: Recorder, path_end: str) -> list[dict[str, Any]]:
    """The model requests: each one streamed (`stream: true`) and answered 200 as a stream."""
    reqs = model_requests(recorder, path_end)
    assert reqs, f"no request to {path_end}"
    for r in reqs:
        assert r["body"].get("stream") is True, f"{r['path']} not streamed: {r['body']}"
        assert r["status"] == 200, r.get("response")
        assert r["response_headers"]["content-type"].startswith("text/event-stream")
    return reqs


def events(stream: str) -> list[dict[str, Any]]:
    """The JSON data of a server-sent event stream."""
    out = []
    for line in stream.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[len("data: "):]))
    return out


# ---- Claude Code ----------------------------------------------------------------------------

def test_claude_code_answers_a_prompt(served: Served) -> None:
    proc, rec = served.agent("claude-code", HELLO)
    assert proc.returncode == 0 and proc.stdout.strip() == PLAIN, rec.told(proc)
    reqs = streamed_all_the_way(rec, "/v1/messages")
    assert all(r["query"] == {"beta": "true"} for r in reqs)


@pytest.mark.parametrize("model", MODELS)
def test_claude_code_runs_its_tool_and_answers(served: Served, model: str) -> None:
    proc, rec = served.agent("claude-code", ASK, model)
    assert proc.returncode == 0 and proc.stdout.strip() == AFTER, rec.told(proc)
    first, *rest = streamed_all_the_way(rec, "/v1/messages")
    no_markup(model, [first, *rest])
    calls = [e["content_block"] for e in events(first["response"])
             if e.get("type") == "content_block_start"
             and e["content_block"]["type"] == "tool_use"]
    assert [c["name"] for c in calls] == ["Bash"], rec.told(proc)
    # The follow-up carries the tool's output, as Claude Code ran it.
    results = [block for msg in rest[-1]["body"]["messages"] if isinstance(msg["content"], list)
               for block in msg["content"] if block.get("type") == "tool_result"]
    assert len(results) == 1 and TRIGGER in json.dumps(results[0]["content"]), results
    assert results[0]["tool_use_id"] == calls[0]["id"] and not results[0].get("is_error")
    observed("claude-code", model, [first, *rest])


def test_claude_code_with_a_named_key(served: Served) -> None:
    """Claude Code with ANTHROPIC_API_KEY set to a key of exod's (issue 48), limited to the
    instance it uses: served; with a key exod does not know, refused (401) and said so."""
    secret = new_secret()
    before = yaml.safe_load(served.d.config_path.read_text())
    keyed = {**before, "api": {**before.get("api", {}), "keys": [
        {"name": "claude", "owner": "a developer", "hash": hash_text(secret),
         "instances": [MODEL]}]}}
    served.d.write_config(keyed)
    served.d.ctl("reload")
    try:
        proc, rec = served.agent("claude-code", HELLO, env={"ANTHROPIC_API_KEY": secret})
        assert proc.returncode == 0 and proc.stdout.strip() == PLAIN, rec.told(proc)
        streamed_all_the_way(rec, "/v1/messages")
        proc, rec = served.agent("claude-code", HELLO, env={"ANTHROPIC_API_KEY": new_secret()})
        refused = model_requests(rec, "/v1/messages")
        # Asked once: the 401 says not to retry (x-should-retry), which Claude Code obeys
        # (without it, ten retries over three minutes before it gives up).
        assert proc.returncode != 0 and len(refused) == 1, rec.told(proc)
        assert all(r["status"] == 401 for r in refused), rec.told(proc)
    finally:
        served.d.write_config(before)
        served.d.ctl("reload")


# ---- Codex ----------------------------------------------------------------------------------

def test_codex_answers_a_prompt(served: Served) -> None:
    proc, rec = served.agent("codex", HELLO)
    assert proc.returncode == 0 and proc.stdout.strip() == PLAIN, rec.told(proc)
    streamed_all_the_way(rec, "/v1/responses")


@pytest.mark.parametrize("model", MODELS)
def test_codex_runs_its_tool_and_answers(served: Served, model: str) -> None:
    proc, rec = served.agent("codex", ASK, model)
    assert proc.returncode == 0 and proc.stdout.strip() == AFTER, rec.told(proc)
    first, *rest = streamed_all_the_way(rec, "/v1/responses")
    no_markup(model, [first, *rest])
    done = [e["item"] for e in events(first["response"])
            if e.get("type") == "response.output_item.done"]
    calls = [item for item in done if item["type"] == "function_call"]
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == \
        [("exec_command", {"cmd": COMMAND})], rec.told(proc)
    outputs = [item for item in rest[-1]["body"]["input"]
               if item.get("type") == "function_call_output"]
    assert len(outputs) == 1 and outputs[0]["call_id"] == calls[0]["call_id"], outputs
    assert TRIGGER in json.dumps(outputs[0]["output"]), outputs
    observed("codex", model, [first, *rest])


# ---- opencode -------------------------------------------------------------------------------

def chat_tool_calls(stream: str) -> list[dict[str, Any]]:
    """The tool calls of a chat completions stream, their deltas joined: [{id, name,
    arguments (parsed)}] by index."""
    calls: dict[int, dict[str, Any]] = {}
    for chunk in events(stream):
        for choice in chunk.get("choices") or []:
            for tc in (choice.get("delta") or {}).get("tool_calls") or []:
                call = calls.setdefault(tc["index"], {"id": None, "name": "", "arguments": ""})
                call["id"] = tc.get("id") or call["id"]
                fn = tc.get("function") or {}
                call["name"] += fn.get("name") or ""
                call["arguments"] += fn.get("arguments") or ""
    return [{**c, "arguments": json.loads(c["arguments"] or "{}")}
            for _, c in sorted(calls.items())]


def opencode_turns(recorder: Recorder) -> list[dict[str, Any]]:
    """opencode's model requests, each streamed: those of its session (with its tools), apart
    from the one that asks for the session's title (no tools, its own system prompt)."""
    reqs = streamed_all_the_way(recorder, "/v1/chat/completions")
    turns = [r for r in reqs if r["body"].get("tools")]
    assert len(reqs) - len(turns) <= 1, [r["body"].get("messages") for r in reqs]
    assert all("bash" in {t["function"]["name"] for t in r["body"]["tools"]} for r in turns)
    return turns


def test_opencode_answers_a_prompt(served: Served) -> None:
    proc, rec = served.agent("opencode", HELLO)
    assert proc.returncode == 0 and proc.stdout.strip() == PLAIN, rec.told(proc)
    (turn,) = opencode_turns(rec)
    assert chat_tool_calls(turn["response"]) == [], rec.told(proc)


@pytest.mark.parametrize("model", MODELS)
def test_opencode_runs_its_tool_and_answers(served: Served, model: str) -> None:
    proc, rec = served.agent("opencode", ASK, model)
    assert proc.returncode == 0 and proc.stdout.strip() == AFTER, rec.told(proc)
    first, *rest = opencode_turns(rec)
    no_markup(model, [first, *rest])
    calls = chat_tool_calls(first["response"])
    assert [(c["name"], c["arguments"]) for c in calls] == [("bash", {"command": COMMAND})], \
        rec.told(proc)
    # The follow-up carries the tool's output, as opencode ran it.
    results = [m for m in rest[-1]["body"]["messages"] if m["role"] == "tool"]
    assert len(results) == 1 and results[0]["tool_call_id"] == calls[0]["id"], results
    assert TRIGGER in json.dumps(results[0]["content"]), results
    observed("opencode", model, [first, *rest])


# ---- Agent libraries ------------------------------------------------------------------------

def echo_tool(seen: list[str]) -> Any:
    def echo(text: str) -> str:
        """Echo `text` back."""
        seen.append(text)
        return text
    return echo


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("api", ["chat", "responses"])
def test_openai_agents_sdk_runs_a_tool_and_answers(served: Served, api: str,
                                                   model: str) -> None:
    from agents import (Agent, OpenAIChatCompletionsModel, OpenAIResponsesModel, RunConfig,
                        Runner, function_tool)

    seen: list[str] = []

    async def session(url: str) -> Any:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=clients.KEY, max_retries=0)
        sdk_model = OpenAIChatCompletionsModel(model=model, openai_client=client) \
            if api == "chat" else OpenAIResponsesModel(model=model, openai_client=client)
        agent = Agent(name="exod", instructions="Use the tools you have.", model=sdk_model,
                      tools=[function_tool(echo_tool(seen))])
        result = Runner.run_streamed(agent, ASK, run_config=RunConfig(tracing_disabled=True))
        async for _ in result.stream_events():
            pass
        return result.final_output

    with served.proxy() as (rec, url):
        output = asyncio.run(session(url))
    assert seen == [TRIGGER]
    assert output == AFTER
    reqs = streamed_all_the_way(rec, "/chat/completions" if api == "chat" else "/responses")
    assert len(reqs) == 2
    no_markup(model, reqs)
    observed(f"agents-sdk-{api}", model, reqs)


@pytest.mark.parametrize("model", MODELS)
def test_pydantic_ai_runs_a_tool_and_answers(served: Served, model: str) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    seen: list[str] = []

    async def session(url: str) -> str:
        chat_model = OpenAIChatModel(model, provider=OpenAIProvider(base_url=url + "/v1",
                                                                    api_key=clients.KEY))
        agent = Agent(chat_model, instructions="Use the tools you have.",
                      tools=[echo_tool(seen)])
        async with agent.run_stream(ASK) as result:
            return str(await result.get_output())

    with served.proxy() as (rec, url):
        output = asyncio.run(session(url))
    assert seen == [TRIGGER]
    assert output == AFTER
    reqs = streamed_all_the_way(rec, "/chat/completions")
    assert len(reqs) == 2
    no_markup(model, reqs)
    observed("pydantic-ai", model, reqs)


# ---- The model, and fields exod does not know ----------------------------------------------

ECHO = {"type": "function", "function": {
    "name": "echo", "description": "Echo text back.",
    "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                   "required": ["text"]}}}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_model_calls_and_answers_by_its_weights_alone(served: Served,
                                                          temperature: float) -> None:
    client = openai.OpenAI(base_url=served.url + "/v1", api_key=clients.KEY, max_retries=0)

    def chat(messages: list[dict[str, Any]], seed: int) -> Any:
        return client.chat.completions.create(model=MODEL, messages=messages, tools=[ECHO],
                                              temperature=temperature, seed=seed,
                                              max_tokens=32).choices[0]

    ask: list[dict[str, Any]] = [{"role": "user", "content": ASK}]
    for seed in range(3):
        plain = chat([{"role": "user", "content": HELLO}], seed)
        assert (plain.message.content, plain.finish_reason) == (PLAIN, "stop")
        call = chat(ask, seed)
        assert call.finish_reason == "tool_calls", call
        (tc,) = call.message.tool_calls
        assert (tc.function.name, json.loads(tc.function.arguments)) == ("echo",
                                                                          {"text": TRIGGER})
        after = chat([*ask, {"role": "assistant", "content": None,
                             "tool_calls": [tc.model_dump()]},
                      {"role": "tool", "tool_call_id": tc.id, "content": TRIGGER}], seed)
        assert (after.message.content, after.finish_reason) == (AFTER, "stop")


def ignored_counts(url: str) -> dict[tuple[str, str], float]:
    """exod_ignored_fields_total by (dialect, field), from /metrics."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    return {(s.labels.get("dialect", ""), s.labels.get("field", "")): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.name == "exod_ignored_fields_total"}


def test_an_unknown_field_is_answered_named_and_counted(served: Served) -> None:
    """New client releases keep adding fields: exod answers, names what it ignored in
    `x-exod-ignored-fields` and counts it in exod_ignored_fields_total{dialect,field}."""
    oa = openai.OpenAI(base_url=served.url + "/v1", api_key=clients.KEY, max_retries=0)
    an = anthropic.Anthropic(base_url=served.url, api_key=clients.KEY, max_retries=0)
    hello = [{"role": "user", "content": HELLO}]
    sent = {
        "exod_probe_chat": lambda extra: oa.chat.completions.with_raw_response.create(
            model=MODEL, messages=hello, max_tokens=8, extra_body=extra),
        "exod_probe_messages": lambda extra: an.messages.with_raw_response.create(
            model=MODEL, messages=hello, max_tokens=8, extra_body=extra),
        "exod_probe_responses": lambda extra: oa.responses.with_raw_response.create(
            model=MODEL, input=HELLO, max_output_tokens=8, extra_body=extra),
    }
    for field, create in sent.items():
        raw = create({field: {"new": True}})
        assert raw.http_response.status_code == 200
        named = raw.headers.get("x-exod-ignored-fields", "")
        assert field in [f.strip() for f in named.split(",")], (field, dict(raw.headers))
        parsed = raw.parse()
        text = getattr(parsed, "output_text", None) or (
            parsed.content[0].text if hasattr(parsed, "content")
            else parsed.choices[0].message.content)
        assert text == PLAIN
    counts = ignored_counts(served.url)
    for field in sent:
        got = {dialect: n for (dialect, f), n in counts.items() if f == field}
        assert len(got) == 1 and next(iter(got.values())) >= 1, (field, counts)
