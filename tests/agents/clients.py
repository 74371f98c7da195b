"""How the suite runs each real agent against an API at `base_url`: the command line, the
environment and the config files, exactly as docs/agents.md shows them.

The agents come from npm, installed by the test set-up (scripts/agents.sh) into AGENTS, a
git-ignored folder of the checkout. Everything points at loopback: nothing an agent does here
reaches another host (tests.agents.capture records what each sent, and the notes there say what
each tried before these settings).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
AGENTS = REPO / ".agents"
BIN = AGENTS / "node_modules" / ".bin"
KEY = "exod"  # any key will do: exod checks none unless its config lists api keys


@dataclass(frozen=True)
class Run:
    argv: list[str]
    env: dict[str, str]
    cwd: Path

    def __call__(self, timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv, env=self.env, cwd=self.cwd, capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False)


def _base_env(home: Path) -> dict[str, str]:
    # A home of its own: every agent writes state there (sessions, settings, ids).
    return {"HOME": str(home), "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": "C.UTF-8", "TERM": "dumb"}


def claude_code(base_url: str, model: str, prompt: str, home: Path, cwd: Path) -> Run:
    """`claude -p PROMPT`. CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 turns off its telemetry,
    error reports, update checks and the HEAD /api/hello probe (without it, it looks up
    api.anthropic.com). The small-fast model of its background tasks is exod's model too.
    CLAUDE_CODE_ATTRIBUTION_HEADER=0 keeps its billing line out of the system prompt: that line
    carries a hash of each session's first prompt, and atop the prompt it kept a new session
    from reusing the system prompt and tools from exod's prompt cache (docs/prompt-cache.md)."""
    env = {**_base_env(home), "ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_API_KEY": KEY,
           "ANTHROPIC_MODEL": model, "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "CLAUDE_CODE_ATTRIBUTION_HEADER": "0"}
    return Run([str(BIN / "claude"), "-p", prompt], env, cwd)


CODEX_CONFIG = """\
model = "{model}"
model_provider = "exod"

[model_providers.exod]
name = "exod"
base_url = "{base_url}/v1"
env_key = "EXOD_API_TOKEN"
wire_api = "responses"

[analytics]
enabled = false

[features]
plugins = false
"""


def codex(base_url: str, model: str, prompt: str, home: Path, cwd: Path) -> Run:
    """`codex exec --skip-git-repo-check PROMPT` with $CODEX_HOME/config.toml (CODEX_CONFIG).
    Without `analytics.enabled = false` it looks up ab.chatgpt.com; without `features.plugins
    = false`, github.com, api.github.com and chatgpt.com (its plugin marketplace)."""
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(CODEX_CONFIG.format(model=model, base_url=base_url))
    env = {**_base_env(home), "CODEX_HOME": str(codex_home), "EXOD_API_TOKEN": KEY}
    return Run([str(BIN / "codex"), "exec", "--skip-git-repo-check", prompt], env, cwd)


def opencode_config(base_url: str, model: str) -> dict[str, Any]:
    """opencode's config (opencode.json) for exod as provider `exod`: a custom provider on the
    OpenAI-compatible chat completions API. The @ai-sdk/openai-compatible package is built into
    opencode's binary, so naming it installs nothing."""
    return {
        "$schema": "https://opencode.ai/config.json",
        "provider": {"exod": {
            "npm": "@ai-sdk/openai-compatible",
            "name": "exod",
            "options": {"baseURL": f"{base_url}/v1", "apiKey": KEY},
            "models": {model: {"name": model}},
        }},
        "model": f"exod/{model}",
        "small_model": f"exod/{model}",  # its session titles (a request without tools) too
        # Only exod: not the providers it would load from the environment or its own (zen).
        "enabled_providers": ["exod"],
        # Its TUI's update check (npm's registry, then an upgrade): `run` makes none, but the
        # config is the one docs/agents.md shows, for the TUI too.
        "autoupdate": False,
        "share": "disabled",  # never upload a session to opencode.ai
        # Off by default in this release; named so that a release that turns them on does not
        # download language servers (from GitHub and npm) when the model edits a file.
        "lsp": False,
        "formatter": False,
    }


def opencode(base_url: str, model: str, prompt: str, home: Path, cwd: Path) -> Run:
    """`opencode run PROMPT` with $HOME/.config/opencode/opencode.json (opencode_config).
    OPENCODE_DISABLE_MODELS_FETCH=1 keeps it on the catalogue built into it: without it, it
    fetches models.opencode.ai/api.json at start (and every hour). npm_config_offline=true: at
    start it installs @opencode-ai/plugin into each config folder (for plugins and tools written
    there; this config has none) with npm's own library, which reads npm's settings: offline, the
    install fails at once from an empty cache (a warning in its log) instead of reaching
    registry.npmjs.org."""
    config_dir = home / ".config" / "opencode"
    config_dir.mkdir(parents=True, exist_ok=True)
    (config_dir / "opencode.json").write_text(json.dumps(opencode_config(base_url, model),
                                                         indent=2))
    env = {**_base_env(home), "OPENCODE_DISABLE_MODELS_FETCH": "1", "npm_config_offline": "true"}
    return Run([str(BIN / "opencode"), "run", prompt], env, cwd)


def version(binary: str) -> str:
    """The installed agent's `--version` line."""
    proc = subprocess.run([binary, "--version"], capture_output=True, text=True,
                          timeout=60, check=False, stdin=subprocess.DEVNULL)
    return proc.stdout.strip() or proc.stderr.strip()


RUNS = {"claude-code": claude_code, "codex": codex, "opencode": opencode}
