"""The prompt cache in real agent sessions (issue 44): each agent, configured as docs/agents.md
shows, runs its tool session twice in one home and project folder, each time with another
prompt (tests.agents.sessions), as a user starts a second session after the first. From what
the recording proxy saw and exod's own tokens (tests.agents.cache_figures), per request:

- every request after the first reuses from the cache (`usage`'s cached tokens) at least 90%
  of the tokens its prompt shares with the previous request's;
- the first request of the second session reuses its system prompt and tools.

Claude Code as installed writes a billing line atop its system prompt, with a hash of each
session's first prompt: docs/agents.md turns it off (CLAUDE_CODE_ATTRIBUTION_HEADER=0), and an
instance's `drop_system_lines` drops it when the client cannot be configured; a third session
here, as installed, on that instance, reuses the first two's system prompt and tools. Codex
runs on an instance without a RAM tier: every entry is served while the disk tier writes it,
then from disk, as an agent's gigabytes of KV are on a real model (the engine's own checks of
that: prompt_cache_checks.py).

One daemon (two instances of the one-layer agent model, tests.models.agent), about 18
CPU-seconds (tests.cpu_profile) and 25-45 s: the prefill of Claude Code's ~23k-token and
Codex's ~18k-token prompts once each, the agents' own start-ups, and rendering every prompt
again for the figures (one process).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agents import matrix, sessions
from tests.agents.cache_figures import GOAL, Figure, Run, figures, shortfalls, table
from tests.harness import Daemon
from tests.models.agent import AFTER, make_agent_model
from tests.models.tiny import with_tool_template

BILLING = "x-anthropic-billing-header:"
RAM, NO_RAM = "agent", "agent-no-ram"
CONFIG = {RAM: {"drop_system_lines": [BILLING]}, NO_RAM: {"prompt_cache_bytes": 0}}
# (agent, instance): two sessions each, as documented.
AGENTS = [("claude-code", RAM), ("codex", NO_RAM), *((lib, RAM) for lib in sessions.LIBRARIES)]


class Ran:
    """Every session, then the figures of each agent's (rendered once, in one process)."""

    def __init__(self, model: Path) -> None:
        self.model = model
        self.sessions: dict[str, list[sessions.Session]] = {}
        self.drops: dict[str, tuple[str, ...]] = {}
        self._figures: dict[str, list[Figure]] | None = None

    def figures(self) -> dict[str, list[Figure]]:
        if self._figures is None:
            runs = [Run(name, [s.requests for s in ran], self.drops[name])
                    for name, ran in self.sessions.items()]
            self._figures = dict(zip(self.sessions, figures(self.model, runs), strict=True))
        return self._figures


@pytest.fixture(scope="module")
def ran(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ran]:
    tmp = tmp_path_factory.mktemp("agent-cache")
    model = make_agent_model(with_tool_template(tiny_model, tmp / "tools"), tmp / "agent")
    d = Daemon({"instances": {name: {"model": str(model), **extra}
                              for name, extra in CONFIG.items()}})
    out = Ran(model)
    try:
        d.start()
        for name in CONFIG:
            d.until_state(name, "ready")
        for agent, instance in AGENTS:
            for prompt in sessions.PROMPTS[:2]:
                s = sessions.run(agent, d.api_url(), instance, prompt, tmp / agent)
                out.sessions.setdefault(agent, []).append(s)
            out.drops[agent] = tuple(CONFIG[instance].get("drop_system_lines", ()))
        # Claude Code as installed (its billing line on), a third session, on the instance
        # that drops the line.
        installed = sessions.run("claude-code", d.api_url(), RAM, sessions.PROMPTS[2],
                                 tmp / "claude-code",
                                 env={"CLAUDE_CODE_ATTRIBUTION_HEADER": None})
        out.sessions["claude-code"].append(installed)
        yield out
    finally:
        d.close()


def answered(s: sessions.Session) -> None:
    assert s.returncode == 0 and s.output == AFTER and len(s.requests) == 2, \
        (s.returncode, s.output, s.stderr, [r.get("status") for r in s.requests])


@pytest.mark.parametrize("agent", [a for a, _ in AGENTS])
def test_each_turn_and_each_new_session_reuses_the_cache(ran: Ran, agent: str) -> None:
    for s in ran.sessions[agent]:
        answered(s)
    rows = ran.figures()[agent]
    shown = table(rows)
    assert not shortfalls(rows), "\n".join([shown, *shortfalls(rows)])
    later = [f for f in rows if f.shared is not None]
    assert later and all(f.reuse is not None and f.reuse >= GOAL for f in later), shown
    second = [f for f in rows if f.session > 1 and f.turn == 1]
    assert second and all(f.cached >= f.head > 0 for f in second), shown
    # The matrix's cache cell (tests.agents.matrix), on the agent model's json_tools format.
    matrix.saw(agent, "json_tools", reuse=min(f.reuse or 0.0 for f in later), turns=len(later),
               head_reused=True, head=min(f.head for f in second))


def system_texts(s: sessions.Session) -> list[str]:
    return [b["text"] for r in s.requests for b in r["body"]["system"]]


def test_claude_code_as_documented_sends_no_billing_line(ran: Ran) -> None:
    documented = ran.sessions["claude-code"][:2]
    assert not any(t.startswith(BILLING) for s in documented for t in system_texts(s))


def test_claude_code_as_installed_reuses_the_cache_where_the_line_is_dropped(ran: Ran) -> None:
    """Its billing line carries a hash of its first prompt, atop the system prompt: dropped by
    the instance, its prompt is the documented one's, and the third session reuses the first
    two's system prompt and tools."""
    installed = ran.sessions["claude-code"][2]
    answered(installed)
    lines = [t for t in system_texts(installed) if t.startswith(BILLING)]
    if not lines:
        pytest.skip("this Claude Code sends no billing line: nothing to drop")
    first = next(f for f in ran.figures()["claude-code"] if f.session == 3 and f.turn == 1)
    assert first.cached >= first.head > 0, table(ran.figures()["claude-code"])
