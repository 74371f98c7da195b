"""The prompt cache's figures in agent sessions, per request: its prompt tokens, the tokens its
prompt shares with the previous request's (from the start: what a prefix cache can reuse), the
tokens exod reused from its cache (`usage`), and the length of its system prompt and tools.

The tokens are exod's own: each recorded body is read by its dialect (exod.api.dialects), with
the instance's `drop_system_lines`, and rendered by the runner's own code
(exod.runner.serving.prepare.prompt_tokens) with the model's tokenizer. That needs mlx, so it
runs in a process of its own (`tokens`: ``python -m tests.agents.cache_figures MODEL``, the
runs' bodies in on stdin, counts out on stdout); each rendered length is checked against exod's
usage.

"System prompt and tools" is the prompt's head as mlx_lm.server cuts it: the leading system
turns (a Responses `developer` turn is one; with a template that takes a system turn only
first, every system turn, joined as the runner joins them) rendered with the tools before an
empty user turn, as far as that agrees with the whole prompt.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
GOAL = 0.9  # of the tokens shared with the previous request, reused from the cache


@dataclass(frozen=True)
class Figure:
    agent: str
    session: int  # 1, 2, ...
    turn: int  # the session's model requests, 1, 2, ...
    prompt: int  # prompt tokens, as exod counted them
    rendered: int  # the same, as rendered here (must equal `prompt`)
    shared: int | None  # with the previous request's prompt (None: the first request)
    cached: int  # reused from the cache, as exod reported it
    head: int  # the system prompt and tools

    @property
    def reuse(self) -> float | None:
        """`cached` / `shared`: the share of what a prefix cache could reuse that it did."""
        if self.shared is None:
            return None
        return 1.0 if self.shared == 0 else min(self.cached, self.shared) / self.shared

    @property
    def head_reused(self) -> bool:
        return self.cached >= self.head


# ---- what exod answered -------------------------------------------------------------------
def usage(record: dict[str, Any]) -> tuple[list[int], int]:
    """(prompt tokens, cached tokens) from a recorded answer, whole or streamed, in its
    dialect: chat completions, Anthropic Messages or Responses. The prompt as the ways to
    read it: Anthropic's `input_tokens` are the tokens not read from the cache (the prompt is
    their sum with `cache_read_input_tokens` and `cache_creation_input_tokens`), which exod
    counted as the whole prompt before it followed Anthropic there."""
    text = record.get("response") or ""
    found: list[dict[str, Any]] = []
    try:
        found.append(json.loads(text))
    except ValueError:
        for line in text.splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                found.append(json.loads(line[len("data: "):]))
    got: dict[str, Any] = {}
    for event in found:
        for holder in (event, event.get("message"), event.get("response")):
            if isinstance(holder, dict) and isinstance(holder.get("usage"), dict):
                got = holder["usage"]  # the last one is the whole count
    if "prompt_tokens" in got:  # chat completions
        details = got.get("prompt_tokens_details") or {}
        return [got["prompt_tokens"]], details.get("cached_tokens") or 0
    if "cache_read_input_tokens" in got or record["path"].endswith("/messages"):
        read = got.get("cache_read_input_tokens") or 0
        fresh = got.get("input_tokens", 0)
        return [fresh + read + (got.get("cache_creation_input_tokens") or 0), fresh], read
    details = got.get("input_tokens_details") or {}
    return [got.get("input_tokens", 0)], details.get("cached_tokens") or 0


# ---- exod's tokens (in a process of its own: mlx) ----------------------------------------
@dataclass(frozen=True)
class Run:
    """An agent's sessions on one instance, in the order they ran: each session's recorded
    model requests, and the instance's `drop_system_lines`."""

    agent: str
    sessions: list[list[dict[str, Any]]]
    drop: tuple[str, ...] = ()


def tokens(model: Path, runs: list[Run]) -> list[list[dict[str, int]]]:
    """For each run, for each of its requests in order: `rendered` (its prompt's length),
    `shared` (tokens in common with the previous request's prompt of the run, from the start;
    -1 for the first) and `head` (its system prompt and tools). One process for all."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    argv = [sys.executable, "-m", "tests.agents.cache_figures", str(model)]
    sent = json.dumps([{"drop": list(run.drop),
                        "requests": [{"path": r["path"], "body": r["body"]}
                                     for session in run.sessions for r in session]}
                       for run in runs])
    proc = subprocess.run(argv, input=sent, capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=600, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"cache_figures exited {proc.returncode}: {proc.stderr[-3000:]}")
    return list(json.loads(proc.stdout.strip().splitlines()[-1]))


def figures(model: Path, runs: list[Run]) -> list[list[Figure]]:
    """Each run's figures: every request compared with the one before it, across sessions
    too (a session's first request with the previous session's last)."""
    out = []
    for run, counted in zip(runs, tokens(model, runs), strict=True):
        flat = [(s, t, r) for s, reqs in enumerate(run.sessions, 1)
                for t, r in enumerate(reqs, 1)]
        rows = []
        for (s, t, r), c in zip(flat, counted, strict=True):
            prompts, cached = usage(r)
            prompt = c["rendered"] if c["rendered"] in prompts else prompts[0]
            rows.append(Figure(run.agent, s, t, prompt, c["rendered"],
                               None if c["shared"] < 0 else c["shared"], cached, c["head"]))
        out.append(rows)
    return out


def table(rows: list[Figure]) -> str:
    """The figures as a text table, one request a line."""
    lines = [f"{'agent':<22} {'sess':>4} {'turn':>4} {'prompt':>7} {'shared':>7} "
             f"{'cached':>7} {'reuse':>6} {'head':>6} {'head cached':>11}"]
    for f in rows:
        reuse = "-" if f.reuse is None else f"{f.reuse:.1%}"
        shared = "-" if f.shared is None else str(f.shared)
        first = f.turn == 1
        lines.append(f"{f.agent:<22} {f.session:>4} {f.turn:>4} {f.prompt:>7} {shared:>7} "
                     f"{f.cached:>7} {reuse:>6} {f.head:>6} "
                     f"{('yes' if f.head_reused else 'no') if first else '':>11}")
    return "\n".join(lines)


def shortfalls(rows: list[Figure]) -> list[str]:
    """What misses the goals: a request after the first that reuses under GOAL of what it
    shares with the one before; a session after the first whose first request does not reuse
    its system prompt and tools; a prompt rendered here at another length than exod's."""
    out = []
    for f in rows:
        where = f"{f.agent} session {f.session} turn {f.turn}"
        if f.rendered != f.prompt:
            out.append(f"{where}: rendered {f.rendered} tokens here, exod counted {f.prompt}")
        if f.reuse is not None and f.reuse < GOAL:
            out.append(f"{where}: reused {f.cached} of the {f.shared} tokens shared with the "
                       f"request before ({f.reuse:.1%} < {GOAL:.0%})")
        if f.session > 1 and f.turn == 1 and not f.head_reused:
            out.append(f"{where}: reused {f.cached} tokens, not its system prompt and tools "
                       f"({f.head})")
    return out


def as_json(rows: list[Figure]) -> list[dict[str, Any]]:
    return [{**asdict(f), "reuse": f.reuse, "head_reused": f.head_reused} for f in rows]


# ---- the rendering process ----------------------------------------------------------------
def _render(model: Path, runs: list[dict[str, Any]]) -> list[list[dict[str, int]]]:
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    from exod.api.seal import Sealer

    tokenizer = load_tokenizer(model)
    sealer = Sealer(key=bytes(32))  # the agent model writes no reasoning to open
    return [_counts(tokenizer, sealer, run["requests"], tuple(run["drop"])) for run in runs]


def _counts(tokenizer: Any, sealer: Any, requests: list[dict[str, Any]],
            drop: tuple[str, ...]) -> list[dict[str, int]]:
    from dataclasses import replace

    from exod.api.dialects.anthropic import request as anthropic_request
    from exod.api.dialects.responses import request as responses_request
    from exod.api.dialects.openai.request import parse_chat
    from exod.core.system_lines import drop_system_lines
    from exod.runner.serving.prepare import chat_prompt, prompt_tokens

    out: list[dict[str, int]] = []
    before: list[int] | None = None
    for r in requests:
        path, body = r["path"], r["body"]
        if path.endswith("/messages"):
            gen = anthropic_request.parse(body, sealer)[0].gen
        elif path.endswith("/responses"):
            gen = responses_request.parse(body, sealer)[0].gen
        else:
            gen = parse_chat(body).gen
        gen = replace(gen, messages=drop_system_lines(gen.messages or [], drop))
        prompt = prompt_tokens(tokenizer, gen)
        leading = []
        for msg in _as_rendered(tokenizer, gen):
            if msg["role"] != "system":
                break
            leading.append(msg)
        head_tokens = chat_prompt(tokenizer, [*leading, {"role": "user", "content": ""}],
                                  gen.tools, gen.chat_template_kwargs, answer=False)
        out.append({"rendered": len(prompt),
                    "shared": -1 if before is None else _common(before, prompt),
                    "head": _common(head_tokens, prompt)})
        before = prompt
    return out


def _as_rendered(tokenizer: Any, gen: Any) -> list[dict[str, Any]]:
    """The turns as the runner's template took them: as sent, else (a template that takes a
    system turn only first) with every system turn joined into the leading one, as
    exod.runner.serving.prepare.chat_prompt does."""
    from exod.core.context_edits import system_first

    messages = gen.messages or []
    try:
        tokenizer.apply_chat_template(messages, tools=gen.tools or None,
                                      add_generation_prompt=True, **gen.chat_template_kwargs)
    except Exception:  # noqa: BLE001 -- the template's own refusal, of any type
        return system_first(messages)
    return messages


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def main() -> None:
    print(json.dumps(_render(Path(sys.argv[1]), json.load(sys.stdin))))


if __name__ == "__main__":
    main()
