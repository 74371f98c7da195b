"""docs/agents.md shows each agent's configuration exactly as the suite runs it
(tests/agents/clients.py): every variable Claude Code is given, every line of Codex's
config.toml."""

from __future__ import annotations

from pathlib import Path

from tests.agents import clients

PAGE = Path(__file__).resolve().parents[2] / "docs" / "agents.md"
URL, NAME = "http://127.0.0.1:52415", "NAME"


def test_claude_codes_environment_is_the_tested_one(tmp_path: Path) -> None:
    run = clients.claude_code(URL, NAME, "hi", tmp_path, tmp_path)
    shown = {line.split()[1].split("=")[0]: line.split()[1].split("=", 1)[1]
             for line in PAGE.read_text().splitlines() if line.strip().startswith("export ")}
    given = {k: v for k, v in run.env.items() if k.startswith(("ANTHROPIC_", "CLAUDE_"))}
    assert set(shown) == set(given)
    for key, value in given.items():
        assert shown[key] == {URL: URL, NAME: NAME, clients.KEY: "TOKEN"}.get(value, value), key


def test_codexs_config_is_the_tested_one(tmp_path: Path) -> None:
    clients.codex(URL, NAME, "hi", tmp_path, tmp_path)
    config = "\n".join(f"    {line}".rstrip() for line in
                       (tmp_path / ".codex" / "config.toml").read_text().splitlines())
    shown = "\n".join(line.split("  #")[0].rstrip() for line in PAGE.read_text().splitlines())
    assert config in shown  # the whole file, in order; the page's comments aside
