"""Every tool-call format through exod's batch engine (exod.runner.serving.batch_engine), in this
process, on the format models (tests.models.formats: a tiny model per family with the family's
real chat template and control tokens):

- the steered model's call of each agent's tool (Claude Code's Bash, Codex's exec_command,
  opencode's bash, the libraries' echo) comes out as exactly that call, its reasoning apart, no
  markup in the answer; sent back (the call and its result, through the model's own template
  as exod adapts the turn to it), the model answers AFTER: the round trip;
- random weights, tools offered, many seeds: no marker of the format ever reaches the answer;
- random weights, calls forced (required, required without parallel calls, named): every call
  parses and validates against its tool's schema, and a named call is exactly one.

Run by test_formats.py in a pytest of its own (this imports mlx); the models come from its
environment (EXOD_FORMAT_MODELS, EXOD_RANDOM_FORMAT_MODELS: JSON objects family -> folder).
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from exod.wire import messages as m
from exod.core.shards import Shard
from exod.runner.cpu import blas

blas.preload()  # before mlx, as in the runner
from exod.runner import formats  # noqa: E402
from exod.runner.load import Loaded  # noqa: E402
from exod.runner.text.load import load_shard  # noqa: E402
from exod.runner.serving.batch_engine import BatchEngine  # noqa: E402
from tests.agents import matrix  # noqa: E402
from tests.models.agent import AFTER, PLAIN  # noqa: E402
from tests.models.families import FAMILIES  # noqa: E402
from tests.models.format_chains import (AGENTS, REASON_AFTER, REASON_CALL, scenarios,  # noqa: E402
                                        thinks)

STEERED: dict[str, str] = json.loads(os.environ.get("EXOD_FORMAT_MODELS", "{}"))
RANDOM: dict[str, str] = json.loads(os.environ.get("EXOD_RANDOM_FORMAT_MODELS", "{}"))
NAMES = sorted(STEERED)
SEEDS = 8  # random answers a family's leak check reads (each ~48 tokens of the format's own)
# A system turn of our own: Mistral's and Devstral's templates write 1-3k tokens of their own
# without one, which sixteen random answers would prefill again each.
SYSTEM = [{"role": "system", "content": "You are terse."}]
ids = itertools.count()
_loaded: dict[str, Loaded] = {}

# A tool a random model can call validly by itself: every string bounded, as a real model
# would close them (a random one rarely writes a closing tag on its own).
WEATHER = {"type": "function", "function": {"name": "weather", "description": "The weather.",
           "parameters": {"type": "object", "properties": {
               "city": {"type": "string", "maxLength": 12},
               "unit": {"type": "string", "enum": ["C", "F"]},
               "days": {"type": "integer", "minimum": 1, "maximum": 14},
               "hourly": {"type": "boolean"}},
               "required": ["city", "days"]}}}
NOTE = {"type": "function", "function": {"name": "note", "description": "Keep a note.",
        "parameters": {"type": "object", "properties": {
            "text": {"type": "string", "maxLength": 16}}, "required": ["text"]}}}


def load(path: str) -> Loaded:
    if path not in _loaded:
        from exod.facts.model_dir import model_layer_count

        n = model_layer_count(Path(path)) or 0
        _loaded[path] = load_shard(Path(path), Shard(0, 1, 0, n, n), progress=lambda i, n: None,
                                   should_stop=lambda: False)
    return _loaded[path]


def run(loaded: Loaded, *reqs: m.Generate) -> list[list[m.Event]]:
    """Admit them all at once, step until every one is done: the events of each, in order."""
    e = BatchEngine(loaded.model, loaded.tokenizer, width=len(reqs), cache_bytes=0)
    for r in reqs:
        e.admit(r)
    got: dict[str, list[m.Event]] = {r.id: [] for r in reqs}
    while e.busy:
        for ev in e.step():
            assert not isinstance(ev, m.Error), ev
            if isinstance(ev, (m.Text, m.ToolCall, m.Done)):
                got[ev.id].append(ev)
    return [got[r.id] for r in reqs]


def parts(events: list[m.Event]) -> tuple[str, str, list[m.ToolCall], m.Done]:
    """(answer, reasoning, calls, done) of one request's events."""
    text = "".join(e.text for e in events if isinstance(e, m.Text))
    thought = "".join(e.reasoning for e in events if isinstance(e, m.Text))
    calls = [e for e in events if isinstance(e, m.ToolCall)]
    done = events[-1]
    assert isinstance(done, m.Done), events
    return text, thought, calls, done


def chat(messages: list[dict[str, Any]], **kw: Any) -> m.Generate:
    kw.setdefault("max_tokens", 96)
    return m.Generate(id=f"r{next(ids)}", kind="chat", messages=messages, **kw)


def markup(loaded: Loaded) -> tuple[str, ...]:
    fmt = formats.format_of(loaded.tokenizer)
    assert fmt is not None, "the format model's format was not found"
    return fmt.markup()


@pytest.mark.parametrize("family", NAMES)
def test_a_steered_call_is_parsed_and_its_result_goes_back(family: str) -> None:
    """Each agent's call: exactly that call (its id in the template's shape), the reasoning
    apart, no markup in the answer. Then the call and its result through the template: AFTER."""
    fam, loaded = FAMILIES[family], load(STEERED[family])
    by_kind = {s.kind: s for s in scenarios(fam) if s.mode == fam.modes[0]}
    firsts = [by_kind[f"call:{agent}"] for agent in AGENTS]
    replies = run(loaded, *(chat(f.messages, tools=f.tools, temperature=1.0, seed=7)
                            for f in firsts))
    answered_turns = []
    for (agent, (tool, arguments)), first, events in zip(AGENTS.items(), firsts, replies,
                                                         strict=True):
        text, thought, calls, done = parts(events)
        assert [(c.name, json.loads(c.arguments)) for c in calls] == [
            (tool["function"]["name"], arguments)], (agent, events)
        assert not text.strip() and not any(x in text for x in markup(loaded)), (agent, text)
        assert done.finish_reason == "tool_calls", done
        if thinks(fam, fam.modes[0]):
            assert thought.strip() == REASON_CALL, (agent, thought)
        call_id = calls[0].call_id or "call_0123456789abcdef01234567"
        answered_turns.append(chat([
            *first.messages,
            {"role": "assistant", "content": text,
             "tool_calls": [{"id": call_id, "type": "function", "function": {
                 "name": calls[0].name, "arguments": json.loads(calls[0].arguments)}}],
             **({"reasoning_content": thought} if thought else {})},
            {"role": "tool", "tool_call_id": call_id, "content": "exod-tool-ran\n"}],
            tools=first.tools, temperature=1.0, seed=7))
    for agent, events in zip(AGENTS, run(loaded, *answered_turns), strict=True):
        text, thought, calls, _ = parts(events)
        assert (text.strip(), calls) == (AFTER, []), (agent, events)
        if thinks(fam, fam.modes[0]):
            assert thought.strip() == REASON_AFTER, (agent, thought)
    plain = by_kind["plain"]
    (events,) = run(loaded, chat(plain.messages, tools=plain.tools, temperature=0))
    assert parts(events)[0].strip() == PLAIN and not parts(events)[2], events
    matrix.saw(matrix.ENGINE, family, steered=True, agents_called=len(AGENTS))


@pytest.mark.parametrize("family", NAMES)
def test_random_weights_never_leak_the_formats_markup(family: str) -> None:
    """Random weights write the format's markers anywhere (whole calls, halves, ends without
    starts): streamed token by token, none reaches the answer."""
    loaded = load(RANDOM[family])
    tools = [WEATHER, NOTE]
    hello = [*SYSTEM, {"role": "user", "content": "Use a tool if you need one."}]
    answers = run(loaded, *(chat(hello, tools=tools, temperature=1.0, seed=s, max_tokens=48)
                            for s in range(SEEDS)))
    shown = [e.text for events in answers for e in events if isinstance(e, m.Text)]
    leaks = [(x, t) for t in shown for x in markup(loaded) if x in t]
    assert not leaks, leaks
    # Each piece's whole answer too: a marker never arrives in two pieces either.
    for events in answers:
        text = parts(events)[0]
        assert not any(x in text for x in markup(loaded)), text
    matrix.saw(matrix.ENGINE, family, random_answers=len(answers),
               leaks=matrix.leaks(markup(loaded), [parts(e)[0] for e in answers]))


@pytest.mark.parametrize("family", NAMES)
def test_forced_calls_on_random_weights_validate(family: str) -> None:
    """tool_choice required (with and without parallel calls) and named: every call parses and
    validates against its tool's schema; named and non-parallel give exactly one."""
    loaded = load(RANDOM[family])
    hello = [*SYSTEM, {"role": "user", "content": "Call a tool."}]
    tools = [WEATHER, NOTE]
    # Room for every call allowed (a random model calls as long as it may: up to MAX_CALLS,
    # of a short note each), after a short reasoning where the format has one.
    kw: dict[str, Any] = {"temperature": 1.0, "max_tokens": 320, "think_budget": 16}
    short = {"type": "function", "function": {**NOTE["function"], "parameters": {
        "type": "object", "properties": {"text": {"type": "string", "maxLength": 3}},
        "required": ["text"]}}}
    reqs = [chat(hello, tools=[short], tool_choice="required", seed=s,
                 **{**kw, "max_tokens": 640}) for s in range(2)]
    reqs += [chat(hello, tools=tools, tool_choice="required", parallel_tool_calls=False,
                  seed=s, **kw) for s in range(2)]
    reqs += [chat(hello, tools=tools, tool_choice="function", tool_name="note", seed=s, **kw)
             for s in range(2)]
    got = run(loaded, *reqs)
    for i, (req, events) in enumerate(zip(reqs, got, strict=True)):
        schemas = {t["function"]["name"]: t["function"]["parameters"] for t in req.tools}
        text, _, calls, done = parts(events)
        assert calls, (family, i, events)
        assert len(calls) == 1 if i >= 2 else len(calls) <= formats.MAX_CALLS, (i, calls)
        for c in calls:
            jsonschema.validate(json.loads(c.arguments), schemas[c.name])
        if i >= 4:
            assert [c.name for c in calls] == ["note"], calls
        assert not any(x in text for x in markup(loaded)), text
        assert done.finish_reason == "tool_calls", done
    matrix.saw(matrix.ENGINE, family, forced=True, forced_requests=len(reqs),
               forced_calls=sum(len(parts(e)[2]) for e in got))
