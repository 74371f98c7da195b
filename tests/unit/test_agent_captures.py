"""What the agents send (tests/agents/captures: whole request bodies of a Claude Code and a
Codex session, a tool round trip each) is read by the dialect it speaks without a 400, even
with api.strict_fields, and what exod leaves out is only what it cannot run. The agents
themselves run against a real daemon in the agents' tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from exod.api.dialects.anthropic import request as anthropic_request
from exod.api.dialects.responses import request as responses_request
from exod.api.seal import Sealer

CAPTURES = Path(__file__).resolve().parents[1] / "agents" / "captures"
SEALER = Sealer(key=b"k" * 32)
# What exod may leave out of an agent's request: tools it cannot run, or that wait for a tool
# search; never a field of the conversation.
LEFT_OUT = {"tools[].defer_loading", "tools[].type=web_search"}


def bodies(agent: str) -> list[dict[str, Any]]:
    return [r["body"] for r in json.loads((CAPTURES / f"{agent}.json").read_text())["requests"]]


@pytest.mark.parametrize("strict", [False, True])
def test_claude_code_s_requests_are_served(strict: bool) -> None:
    for body in bodies("claude-code"):
        req, view = anthropic_request.parse(body, SEALER, strict)
        assert set(req.ignored) <= LEFT_OUT
        g = req.gen
        names = [t["function"]["name"] for t in g.tools]
        assert "Bash" in names and "DeferredToolPlaceholder" not in names
        assert g.chat_template_kwargs == {"enable_thinking": True}  # adaptive, effort high
        assert g.context_edits == [{"type": "clear_thinking_20251015", "keep": -1}]
        assert view.omit_thinking and view.edits
        # Its environment: a system turn inside `messages`, kept for the runner to place.
        assert [m["role"] for m in g.messages][:3] == ["system", "user", "system"]
    follow_up = anthropic_request.parse(bodies("claude-code")[1], SEALER)[0].gen.messages
    assert follow_up[-2]["tool_calls"][0]["function"]["name"] == "Bash"
    assert follow_up[-1]["role"] == "tool" and "exod-tool-ran" in follow_up[-1]["content"]


@pytest.mark.parametrize("strict", [False, True])
def test_codex_s_requests_are_served(strict: bool) -> None:
    for body in bodies("codex"):
        req, view = responses_request.parse(body, SEALER, strict)
        assert set(req.ignored) <= LEFT_OUT
        names = [t["function"]["name"] for t in req.gen.tools]
        assert "exec_command" in names and "multi_agent_v1__spawn_agent" in names
        assert view.encrypted and view.namespaces["multi_agent_v1__spawn_agent"] == \
            ("multi_agent_v1", "spawn_agent")
        assert req.gen.messages[0]["role"] == "system"  # its developer instructions
    follow_up = responses_request.parse(bodies("codex")[1], SEALER)[0].gen.messages
    assert follow_up[-2]["tool_calls"][0]["function"]["name"] == "exec_command"
    assert follow_up[-1]["role"] == "tool"
