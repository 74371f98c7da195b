"""The settings that tell each agent an instance's context window, so that its own compaction
fires before exod must refuse a prompt: as docs/agents.md ("Long sessions") shows them and as
tests/integration/test_long_sessions.py runs them, on top of tests.agents.clients' settings.

Neither agent reads a window from the server (Claude Code 2.1.332 and Codex 0.171.0 request
no model list from a base URL set as docs/agents.md sets it): each takes it from its own
configuration.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from tests.agents.clients import Run

# Claude Code keeps min(this, 20000) of the window for its answer, and 13000 more as a buffer:
# it compacts at window - 17096 with this, where its default (32000) would leave it 20000
# less than the window minus 13000.
CLAUDE_CODE_MAX_OUTPUT = 4096


def claude_code_env(window: int) -> dict[str, str]:
    """Claude Code's variables for a model of `window` tokens (a name it does not know: it
    takes CLAUDE_CODE_MAX_CONTEXT_TOKENS only for such a model)."""
    return {"CLAUDE_CODE_MAX_CONTEXT_TOKENS": str(window),
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(CLAUDE_CODE_MAX_OUTPUT)}


def codex_config(window: int, compact_at: int | None = None) -> list[str]:
    """Codex's top-level config.toml keys: it compacts once a turn's tokens reach 90% of
    `model_context_window`, or `model_auto_compact_token_limit` when that is lower."""
    lines = [f"model_context_window = {window}"]
    if compact_at is not None:
        lines.append(f"model_auto_compact_token_limit = {compact_at}")
    return lines


def sized(run: Run, agent: str, window: int, compact_at: int | None = None) -> Run:
    """`run` (a tests.agents.clients run) told the window: Claude Code by its environment,
    Codex by its config.toml (written by clients.codex, in the run's CODEX_HOME)."""
    if agent == "claude-code":
        return replace(run, env={**run.env, **claude_code_env(window)})
    config = Path(run.env["CODEX_HOME"]) / "config.toml"
    # Top-level keys go before the file's first table.
    config.write_text("\n".join(codex_config(window, compact_at)) + "\n" + config.read_text())
    return run


def continued(run: Run, agent: str) -> Run:
    """The same command continuing the agent's last session in its working folder (its
    state is in its home): `claude --continue -p`, `codex exec resume --last`."""
    binary, *rest = run.argv
    if agent == "claude-code":
        return replace(run, argv=[binary, "--continue", *rest])
    prompt = rest[-1]
    return replace(run, argv=[binary, "exec", "--skip-git-repo-check", "resume", "--last",
                              prompt])
