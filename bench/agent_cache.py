"""The prompt cache in real agent sessions (issue 44): per request of each agent's sessions, the
prompt tokens, the tokens its prompt shares with the previous request's, and those exod reused
from its cache (`usage`), with the system prompt and tools (tests.agents.cache_figures).

`python -m bench agent_cache` runs, on the agent model (tests.models.agent, one layer: the
figures are token counts, not times, and are the same on any model with the same tokenizer and
template), each agent's tool session three times in one home and project folder, each session
with another prompt (tests.agents.sessions.PROMPTS): two sessions in a row, then a restart of
the instance (its RAM gone: the disk tier serves) and a third. The goals: every request after
the first reuses at least 90% of the tokens it shares with the one before, and the first
request of every later session reuses its system prompt and tools.

Claude Code runs three ways, each on a cache of its own: as installed (it writes a billing line
atop its system prompt whose hash changes with each session's first prompt: the shortfall), on
an instance with `drop_system_lines: ["x-anthropic-billing-header:"]`, and as docs/agents.md
configures it (`CLAUDE_CODE_ATTRIBUTION_HEADER=0`). Codex, the OpenAI Agents SDK (chat
completions and Responses) and pydantic-ai run as docs/agents.md configures them; Codex also on
an instance without a RAM tier (`prompt_cache_bytes: 0`), where every entry is served while it
is written, then from disk, as an agent's gigabytes of KV are on a real model.

`--json=FILE` writes every figure as JSON too; `--only=claude-code,codex` runs only those
agents (of tests.agents.sessions.CLIS and LIBRARIES).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench import results as recorded
from bench.results import Figure
from tests.agents import sessions
from tests.agents.cache_figures import GOAL, Run, as_json, figures, shortfalls, table
from tests.harness import REPO, Daemon

BILLING = "x-anthropic-billing-header:"
ATTRIBUTION = "CLAUDE_CODE_ATTRIBUTION_HEADER"
# The instances: as configured by default; dropping the billing line; with no RAM tier (every
# entry goes to the disk's writer as it is kept, as an agent's prompt on a real model does: its
# KV, gigabytes, is bigger than the RAM tier).
PLAIN, DROPPING, NO_RAM = "agent", "agent-drop", "agent-no-ram"
# (label, agent, instance, variables on top of the tested ones: None removes one)
CASES: list[tuple[str, str, str, dict[str, str | None]]] = [
    ("claude-code (as installed)", "claude-code", PLAIN, {ATTRIBUTION: None}),
    ("claude-code (drop_system_lines)", "claude-code", DROPPING, {ATTRIBUTION: None}),
    ("claude-code (as documented)", "claude-code", PLAIN, {}),
    ("codex", "codex", PLAIN, {}),
    ("codex (no RAM tier)", "codex", NO_RAM, {}),
    ("agents-sdk-chat", "agents-sdk-chat", PLAIN, {}),
    ("agents-sdk-responses", "agents-sdk-responses", PLAIN, {}),
    ("pydantic-ai", "pydantic-ai", PLAIN, {}),
]


def agent_model(root: Path) -> Path:
    """The agent model (tests.models.agent) over the tiny model with the tool template."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "tests.models.tiny", str(root / "tiny")],
                          cwd=REPO, env=env, capture_output=True, text=True, check=True)
    tiny = Path(proc.stdout.strip().splitlines()[-1])
    from tests.models.agent import make_agent_model
    from tests.models.tiny import with_tool_template

    return make_agent_model(with_tool_template(tiny, root / "tools"), root / "agent")


def run_case(d: Daemon, place: Path, agent: str, instance: str,
             env: dict[str, str | None]) -> list[list[dict[str, Any]]]:
    """Three sessions of `agent` on `instance` (its cache emptied first): two in a row, then a
    restart and a third; each session's recorded model requests."""
    d.ctl("cache", "clear", instance)
    ran: list[list[dict[str, Any]]] = []
    for n, prompt in enumerate(sessions.PROMPTS):
        if n == 2:
            d.ctl("restart", instance)
            d.until_state(instance, "ready")
        s = sessions.run(agent, d.api_url(), instance, prompt, place, env)
        if s.returncode != 0 or not s.requests:
            raise RuntimeError(f"{agent} session {n + 1}: exit {s.returncode}, "
                               f"{len(s.requests)} requests: {s.stderr}")
        ran.append(s.requests)
    return ran


def summary(label: str, rows: list[Any], missed: list[str]) -> list[Figure]:
    """An agent's figures for bench/results: the least reused share of what a later request
    shared with the one before, what new sessions reused, and whether every goal is met."""
    reuse = [f.reuse for f in rows if f.reuse is not None]
    heads = [f for f in rows if f.session > 1 and f.turn == 1]
    return [Figure(f"{label}: later requests, least share reused", 100 * min(reuse) if reuse
                   else None, unit="%", goal=f">= {100 * GOAL:.0f}%"),
            Figure(f"{label}: new sessions reuse their system prompt and tools", None,
                   met=all(f.head_reused for f in heads),
                   text=", ".join(f"{f.cached} of {f.head}" for f in heads) or "-"),
            Figure(f"{label}: every goal", None, met=not missed,
                   text=missed[0] if missed else "met")]


def main() -> None:
    # `python -m bench` takes every other argument for a benchmark's name: options only here.
    opts = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
    out = Path(opts["json"]) if "json" in opts else None
    names = opts["only"].split(",") if "only" in opts else []
    chosen = [c for c in CASES if not names or c[1] in names]
    with tempfile.TemporaryDirectory(prefix="bench-agent-cache-") as tmp:
        root = Path(tmp)
        model = agent_model(root)
        config: dict[str, Any] = {PLAIN: {"model": str(model)},
                                  DROPPING: {"model": str(model), "drop_system_lines": [BILLING]},
                                  NO_RAM: {"model": str(model), "prompt_cache_bytes": 0}}
        d = Daemon({"instances": config}, name="bench-agent-cache")
        runs: list[Run] = []
        try:
            d.start()
            for name in config:
                d.until_state(name, "ready")
            for label, agent, instance, env in chosen:
                place = root / "".join(c if c.isalnum() else "-" for c in label)
                drop = tuple(config[instance].get("drop_system_lines", ()))
                runs.append(Run(agent, run_case(d, place, agent, instance, env), drop))
        finally:
            d.close()
        results = dict(zip([c[0] for c in chosen], figures(model, runs), strict=True))
    for label, rows in results.items():
        print(f"\n## {label}\n{table(rows)}")
        missed = shortfalls(rows)
        print("goals met" if not missed else "\n".join(f"SHORT: {m}" for m in missed))
        recorded.add(*summary(label, rows, missed), section="agent sessions")
    if out is not None:
        out.write_text(json.dumps({k: as_json(v) for k, v in results.items()}, indent=1) + "\n")


if __name__ == "__main__":
    main()
