"""Agent sessions against an API, each through a recording proxy (tests.agents.capture), for
the prompt cache's figures (tests.agents.cache_figures): the two CLI agents, run as
tests.agents.clients configures them, and the two agent libraries, run as
tests/integration/test_agents.py runs them.

A session here is what a user starts: one prompt, in a home and a project folder that the
caller keeps from one session to the next (a second session of the same agent in the same
project, as a user starts it after the first). The prompts ask for the command that the agent
model (tests.models.agent) answers with a call of the agent's shell tool, so each session is a
tool round trip: two model requests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.agents import clients
from tests.agents.capture import Recorder, serve
from tests.models.agent import COMMAND

# One per session, in order: each asks for the command in other words. Claude Code derives a
# hash in its first system line from characters 4, 7 and 20 of the first prompt (see
# docs/prompt-cache.md), and these differ there, as a user's next task does.
PROMPTS = (f"Run `{COMMAND}` in the shell, then tell me what it printed.",
           f"Please run `{COMMAND}` for me, and report its output.",
           f"Could you execute `{COMMAND}` and say what came out?")
CLIS = ("claude-code", "codex")
LIBRARIES = ("agents-sdk-chat", "agents-sdk-responses", "pydantic-ai")
INSTRUCTIONS = "Use the tools you have."
SAFETY = 300.0  # seconds: a bound against hangs; a session takes a few


@dataclass
class Session:
    """One session's model requests, as the proxy recorded them (request and answer)."""

    agent: str
    requests: list[dict[str, Any]]
    output: str  # what the agent printed or returned
    returncode: int = 0
    stderr: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


@contextmanager
def proxy(upstream: str) -> Iterator[tuple[Recorder, str]]:
    """A recording proxy in front of `upstream`: (its record, its base URL)."""
    recorder = Recorder()
    server = serve(recorder, upstream=upstream)
    try:
        yield recorder, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def model_requests(recorder: Recorder) -> list[dict[str, Any]]:
    """The generation requests (not count_tokens, not probes), in order."""
    ends = ("/v1/messages", "/v1/responses", "/v1/chat/completions")
    return [r for r in recorder.requests if r["method"] == "POST" and r["path"].endswith(ends)]


def run_cli(agent: str, upstream: str, model: str, prompt: str, place: Path,
            env: dict[str, str | None] | None = None) -> Session:
    """`agent` (a name in tests.agents.clients.RUNS) once, in `place`'s home and project folder
    (made if missing, kept for the next session). `env`: variables set on top of the tested
    ones (None: removed)."""
    binary = clients.BIN / {"claude-code": "claude", "codex": "codex"}[agent]
    assert binary.exists(), (f"{binary} is missing: the test set-up installs the agents "
                             "(make setup-test, or scripts/agents.sh)")
    home, cwd = place / "home", place / "cwd"
    home.mkdir(parents=True, exist_ok=True)
    cwd.mkdir(parents=True, exist_ok=True)
    with proxy(upstream) as (recorder, url):
        run = clients.RUNS[agent](url, model, prompt, home, cwd)
        for key, value in (env or {}).items():
            if value is None:
                run.env.pop(key, None)
            else:
                run.env[key] = value
        proc = run(timeout=SAFETY)
    return Session(agent, model_requests(recorder), proc.stdout.strip(), proc.returncode,
                   proc.stderr[-2500:])


def run_library(agent: str, upstream: str, model: str, prompt: str) -> Session:
    """One of LIBRARIES once, its agent given an `echo` tool."""
    seen: list[str] = []

    def echo(text: str) -> str:
        """Echo `text` back."""
        seen.append(text)
        return text

    with proxy(upstream) as (recorder, url):
        if agent == "pydantic-ai":
            output = asyncio.run(_pydantic_ai(url, model, prompt, echo))
        else:
            output = asyncio.run(_agents_sdk(url, model, prompt, echo,
                                             agent.rsplit("-", 1)[1]))
    return Session(agent, model_requests(recorder), output, extra={"tool_saw": seen})


async def _agents_sdk(url: str, model: str, prompt: str, echo: Any, api: str) -> str:
    import openai
    from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel,
                        OpenAIResponsesModel, RunConfig, Runner, function_tool)

    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=clients.KEY, max_retries=0)
    chosen = OpenAIChatCompletionsModel(model=model, openai_client=client) if api == "chat" \
        else OpenAIResponsesModel(model=model, openai_client=client)
    # Over chat completions the SDK asks for usage only from OpenAI's own host: asked here, so
    # that exod's answers carry the cached tokens (the prompt is the same either way).
    agent = Agent(name="exod", instructions=INSTRUCTIONS, model=chosen,
                  tools=[function_tool(echo)], model_settings=ModelSettings(include_usage=True))
    result = Runner.run_streamed(agent, prompt, run_config=RunConfig(tracing_disabled=True))
    async for _ in result.stream_events():
        pass
    return str(result.final_output)


async def _pydantic_ai(url: str, model: str, prompt: str, echo: Any) -> str:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    chosen = OpenAIChatModel(model, provider=OpenAIProvider(base_url=url + "/v1",
                                                            api_key=clients.KEY))
    agent = Agent(chosen, instructions=INSTRUCTIONS, tools=[echo])
    async with agent.run_stream(prompt) as result:
        return str(await result.get_output())


def run(agent: str, upstream: str, model: str, prompt: str, place: Path,
        env: dict[str, str | None] | None = None) -> Session:
    """A session of any agent (CLIS or LIBRARIES)."""
    if agent in CLIS:
        return run_cli(agent, upstream, model, prompt, place, env)
    return run_library(agent, upstream, model, prompt)
