"""The conformance matrix of docs/agents.md: agents x tool-call formats, as the suite observed
them, kept in docs/agents-matrix.json and rendered into the page.

The tests that observe a cell (test_agents, test_agent_cache, test_long_sessions, and
format_checks through test_formats) call `saw(agent, format, key=value, ...)` once their own
asserts have passed:

- with EXOD_MATRIX_OUT naming a file (`make agents-matrix`), each value is appended to it as
  one JSON line (pytest-xdist workers and the format checks' own process append at once: one
  write a line, in append mode); `python -m tests.agents.matrix write FILE` then makes the
  JSON from those lines and renders the page;
- otherwise (`make test`) each value is checked against the committed cell (`check`): a claim
  (a session passes, 0 leaks, a call forced valid, reuse in its class, what an agent does past
  the window) that changed fails the test; a figure that moves with an agent's release (its
  prompt's size, how many requests a session took) is informational, refreshed only by
  `make agents-matrix`.

`python -m tests.agents.matrix render` rewrites the page's section from the JSON; a unit test
(tests/unit/test_agents_matrix.py) fails when they differ. Plain data: no mlx.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import sys
from functools import cache
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "docs" / "agents-matrix.json"
PAGE = REPO / "docs" / "agents.md"
ENV = "EXOD_MATRIX_OUT"
BEGIN = "<!-- matrix:begin: written by `make agents-matrix` from docs/agents-matrix.json -->"
END = "<!-- matrix:end -->"
GOAL = 0.9  # reuse's class: at least this share of the tokens shared with the turn before

ENGINE = "engine"  # the row of exod's engine alone (format_checks), no agent
AGENTS = {"claude-code": "Claude Code", "codex": "Codex CLI", "opencode": "opencode",
          "agents-sdk-chat": "OpenAI Agents SDK, chat", "agents-sdk-responses":
          "OpenAI Agents SDK, Responses", "pydantic-ai": "pydantic-ai"}
CLIS = ("claude-code", "codex", "opencode")
# The formats agents meet most, each a model of test_agents' daemon: the json_tools agent
# model (tests.models.agent) and two format models (tests.models.formats).
FORMATS = {"json_tools": "json_tools (agent model)", "harmony": "harmony (gpt-oss)",
           "qwen3_coder": "qwen3_coder (Qwen3-Coder)"}
# What the suite records but never holds to its committed value: it moves with an agent's
# release or a test's sizes. Every other key is a claim, compared whole, except REUSE's.
INFO = {"answers", "turns", "cached", "head", "window", "random_answers", "forced_requests",
        "forced_calls", "agents_called"}
REUSE = {"reuse", "reuse_floor"}


# ---- recording and checking ----------------------------------------------------------------
def record(agent: str, fmt: str, key: str, value: Any) -> None:
    """Append one observed value to EXOD_MATRIX_OUT's file; nothing when it is not set."""
    out = os.environ.get(ENV)
    if not out:
        return
    line = json.dumps({"agent": agent, "format": fmt, "key": key, "value": value}) + "\n"
    fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())  # one write: lines of concurrent writers never interleave
    finally:
        os.close(fd)


@cache
def committed() -> dict[str, Any]:
    return dict(json.loads(DATA.read_text(encoding="utf-8")))


def claim(key: str, value: Any) -> Any:
    """What a value claims: itself, its class for reuse, None for a figure (not a claim)."""
    if key in INFO:
        return None
    if key in REUSE:
        return None if value is None else ("reused" if value >= GOAL else "short")
    return value


def mismatch(cells: dict[str, Any], agent: str, fmt: str, key: str, value: Any) -> str:
    """"" when `value` keeps the claim of the cell in `cells`, else what differs."""
    if key in INFO:
        return ""
    cell = cells.get(agent, {}).get(fmt, {})
    if key not in cell and key == "session" and value is True:
        said = "it does not pass"
    elif key not in cell:
        said = "nothing"
    elif claim(key, cell[key]) == claim(key, value):
        return ""
    else:
        said = shown(key, cell[key])
    return (f"the matrix in docs/agents-matrix.json says {said} for {agent} x {fmt} "
            f"({key}), the suite saw {shown(key, value)}: run make agents-matrix")


def shown(key: str, value: Any) -> str:
    if key in REUSE and isinstance(value, (int, float)):
        return f"{value:.1%} ({'at least' if value >= GOAL else 'under'} {GOAL:.0%})"
    return json.dumps(value, ensure_ascii=False)


def check(agent: str, fmt: str, key: str, value: Any) -> None:
    """Fail when `value` changes a claim of the committed matrix (never while recording)."""
    if os.environ.get(ENV):
        return
    wrong = mismatch(committed().get("cells", {}), agent, fmt, key, value)
    assert not wrong, wrong


def saw(agent: str, fmt: str, **values: Any) -> None:
    """What a test observed of a cell: recorded, or checked (see the module's docstring)."""
    for key, value in values.items():
        record(agent, fmt, key, value)
        check(agent, fmt, key, value)


def leaks(markers: tuple[str, ...], answers: list[str]) -> int:
    """How many answers show a marker."""
    return sum(1 for a in answers if any(x in a for x in markers))


def reuse_floor(turns: list[dict[str, Any]]) -> float | None:
    """Of a session's model requests (as tests.agents.capture recorded them), the least share
    of a turn's whole prompt that the next turn reused from the cache (its `usage`): a floor
    of the share of shared tokens reused, with nothing rendered. None where no usage came."""
    from tests.agents.cache_figures import usage

    seen = [usage(r) for r in turns]
    if len(seen) < 2 or any(prompts[0] == 0 for prompts, _ in seen):
        return None
    return min(min(cached, before[0]) / before[0]
               for (before, _), (_, cached) in zip(seen, seen[1:], strict=False))


# ---- the committed data ----------------------------------------------------------------------
def cells_of(lines: list[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """The recorded lines as cells: agent -> format -> key -> value (the last recorded)."""
    cells: dict[str, dict[str, dict[str, Any]]] = {}
    for line in lines:
        if line.strip():
            r = json.loads(line)
            value = r["value"]
            if isinstance(value, float):
                value = round(value, 4)
            cells.setdefault(r["agent"], {}).setdefault(r["format"], {})[r["key"]] = value
    return {a: {f: dict(sorted(c.items())) for f, c in sorted(row.items())}
            for a, row in sorted(cells.items())}


def versions() -> dict[str, str]:
    """The agents' releases as installed: the CLIs' `--version`, the libraries' packages."""
    from importlib.metadata import PackageNotFoundError, version

    from tests.agents import clients

    out = {}
    for name, binary in (("claude-code", "claude"), ("codex", "codex"),
                         ("opencode", "opencode")):
        path = clients.BIN / binary
        said = clients.version(str(path)) if path.exists() else ""
        found = re.search(r"\d+(\.\d+)+", said)
        out[name] = found[0] if found else "not installed"
    for name, package in (("openai-agents", "openai-agents"),
                          ("pydantic-ai", "pydantic-ai-slim")):
        try:
            out[name] = version(package)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


def write(results: Path) -> dict[str, Any]:
    """docs/agents-matrix.json from a results file, and the page from it."""
    data = {"written": datetime.date.today().isoformat(), "versions": versions(),
            "cells": cells_of(results.read_text(encoding="utf-8").splitlines())}
    DATA.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    render_page()
    return data


# ---- the page ----------------------------------------------------------------------------------
def _pct(value: float) -> str:
    return "100%" if value >= 1 else f"{min(value, 0.999):.1%}"


def _tokens(n: int) -> str:
    return f"{n / 1000:.1f}k" if n >= 1000 else str(n)


# `make agents-matrix` runs every test that records a cell: a cell missing its value did
# not pass (its test failed before it recorded anything).
FAILED = "❌ did not pass"


def _session(cell: dict[str, Any]) -> str:
    if "session" not in cell:
        return FAILED
    out = "✅ passes" if cell["session"] else "❌ fails"
    if "leaks" in cell:
        out += f" · {cell['leaks']} leaks / {cell.get('answers', '?')} answers"
    return out


def _forced(cell: dict[str, Any]) -> str:
    if "forced" not in cell:
        return FAILED
    return (f"{'✅' if cell['forced'] else '❌'} {cell.get('forced_requests', '?')} requests, "
            f"{cell.get('forced_calls', '?')} calls valid")


def _cache(agent: str, cell: dict[str, Any]) -> str:
    if "reuse" in cell:  # test_agent_cache's figures: shared tokens as exod renders them
        out = (f"{'✅' if cell['reuse'] >= GOAL else '❌'} {_pct(cell['reuse'])} of shared "
               f"tokens, {cell.get('turns', '?')} requests")
        if "head_reused" in cell:
            out += (" · " + ("✅" if cell["head_reused"] else "❌") + " a new session reused "
                    f"its {_tokens(cell.get('head', 0))}-token head")
        return out
    if "reuse_floor" in cell:  # test_agents' sessions: usage alone
        return (f"{'✅' if cell['reuse_floor'] >= GOAL else '❌'} turn 2 reused "
                f"{_pct(cell['reuse_floor'])} of turn 1's prompt")
    if agent == "agents-sdk-chat":
        return "not measured: no usage asked"
    return "not measured"


WINDOW_COLUMNS = {
    "first_too_long": "first request past the window",
    "first_too_long_told": "the same, told the window",
    "past_window": "a later turn past the window",
    "past_window_told": "told the window, a session past it",
}
# The cells test_long_sessions runs; the others say "not run".
WINDOW_RUN = {("claude-code", k) for k in WINDOW_COLUMNS} | {
    ("codex", "first_too_long"), ("codex", "past_window_told")}


def _window(agent: str, key: str, cell: dict[str, Any]) -> str:
    if key in cell:
        return str(cell[key])
    return FAILED if (agent, key) in WINDOW_RUN else "not run"


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return [_row(head), _row(["---"] * len(head)), *(_row(r) for r in rows)]


def _agent(agent: str, versions: dict[str, str]) -> str:
    package = {"agents-sdk-chat": "openai-agents", "agents-sdk-responses": "openai-agents"}
    release = versions.get(package.get(agent, agent))
    return f"{AGENTS[agent]} {release}" if release else AGENTS[agent]


def render(data: dict[str, Any]) -> str:
    """The section between BEGIN and END, markers included."""
    from tests.models.families import FAMILIES, SKIPPED

    cells, vers = data.get("cells", {}), data.get("versions", {})

    def cell(agent: str, fmt: str) -> dict[str, Any]:
        return dict(cells.get(agent, {}).get(fmt, {}))

    lines = [BEGIN, "", f"Written {data.get('written', '?')}.", "",
             "### Tool sessions, streamed", ""]
    rows = [[_agent(a, vers), *(_session(cell(a, f)) for f in FORMATS)] for a in AGENTS]
    rows.append(["forced calls (exod's engine)", *(_forced(cell(ENGINE, f)) for f in FORMATS)])
    lines += _table(["agent", *FORMATS.values()], rows)
    lines += ["", "### The prompt cache, turn after turn", ""]
    lines += _table(["agent", *FORMATS.values()],
                    [[_agent(a, vers), *(_cache(a, cell(a, f)) for f in FORMATS)]
                     for a in AGENTS])
    lines += ["", "### Past the window (json_tools agent model, windows of 4k and 40k tokens)",
              ""]
    lines += _table(["agent", *WINDOW_COLUMNS.values()],
                    [[_agent(a, vers), *(_window(a, k, cell(a, "json_tools"))
                                         for k in WINDOW_COLUMNS)] for a in CLIS])
    lines += ["", "### Every format through exod's engine", ""]
    rows = []
    for name, fam in FAMILIES.items():
        c = cell(ENGINE, name)
        steered = (FAILED if "steered" not in c else
                   f"{'✅' if c['steered'] else '❌'} {c.get('agents_called', '?')} agents' "
                   "tools called, the answer after each result")
        leaked = (FAILED if "leaks" not in c else
                  f"{'✅' if c['leaks'] == 0 else '❌'} {c['leaks']} leaks / "
                  f"{c.get('random_answers', '?')} answers")
        rows.append([f"`{name}`", f"`{fam.format}`", steered, leaked, _forced(c)])
    for name, skipped in SKIPPED.items():
        reason = re.sub(r"(<[^<>\s]+>)", r"`\1`", skipped.reason)  # not read as HTML
        rows.append([f"`{name}`", f"`{skipped.format}`", f"not run: {reason}", "", ""])
    lines += _table(["family", "format", "steered calls parsed, sent back",
                     "random weights: markup leaked", "forced calls (random weights)"], rows)
    return "\n".join([*lines, "", END])


def section(page: str) -> str:
    """The page's generated section, markers included ("" when it has none)."""
    if BEGIN not in page or END not in page:
        return ""
    return BEGIN + page.split(BEGIN, 1)[1].split(END, 1)[0] + END


def render_page() -> None:
    page = PAGE.read_text(encoding="utf-8")
    old = section(page)
    assert old, f"docs/agents.md has no {BEGIN} ... {END} section"
    PAGE.write_text(page.replace(old, render(committed_now())), encoding="utf-8")


def committed_now() -> dict[str, Any]:
    return dict(json.loads(DATA.read_text(encoding="utf-8")))


def main(argv: list[str]) -> None:
    if argv[:1] == ["write"] and len(argv) == 2:
        data = write(Path(argv[1]))
        print(f"wrote {DATA} ({sum(len(r) for r in data['cells'].values())} cells) and {PAGE}")
    elif argv == ["render"]:
        render_page()
        print(f"wrote {PAGE}")
    else:
        sys.exit("usage: python -m tests.agents.matrix write RESULTS | render")


if __name__ == "__main__":
    main(sys.argv[1:])
