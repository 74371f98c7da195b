"""docs/agents.md's "Long sessions" shows the settings that tell each agent the window exactly
as tests/integration/test_long_sessions.py runs them (tests.agents.windows): every variable
Claude Code is given, every key of Codex's config.toml."""

from __future__ import annotations

from pathlib import Path

from tests.agents import windows

PAGE = Path(__file__).resolve().parents[2] / "docs" / "agents.md"
WINDOW = 40960  # any: the page says WINDOW


def section() -> list[str]:
    text = PAGE.read_text()
    assert "\n## Long sessions\n" in text
    return text.split("\n## Long sessions\n", 1)[1].split("\n## ", 1)[0].splitlines()


def shown(line: str) -> str:
    """A code line of the page, its comment aside, WINDOW as the test's figure."""
    return line.split("  #")[0].strip().replace("WINDOW", str(WINDOW))


def test_claude_codes_variables_are_the_tested_ones() -> None:
    (command,) = [shown(line) for line in section() if shown(line).startswith("env ")]
    given = dict(word.split("=", 1) for word in command.split()[1:] if "=" in word)
    assert given == windows.claude_code_env(WINDOW)


def test_codexs_keys_are_the_tested_ones() -> None:
    code = [shown(line) for line in section() if line.startswith("    ")]
    keys = {line.split(" = ")[0] for line in code if " = " in line}
    tested = windows.codex_config(WINDOW, compact_at=24000)
    assert keys == {line.split(" = ")[0] for line in tested}
    assert tested[0] in code  # model_context_window = the window itself
