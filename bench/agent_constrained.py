"""Constrained decoding (issues 21, 27): what a grammar costs, and what it buys.

- constrained / free, side by side: aggregate decode tokens/s of requests whose output follows
  a grammar against the same requests unconstrained, at 1 and 8 concurrent clients, for the
  schemas agents send (CASES): an array of short strings (maxLength), an array of nested
  objects, a pydantic model's own schema, a long free string, `json_object`, and a forced call
  (tool_choice required) among a 30 KB tool set, whose baseline is the same tools with
  tool_choice none (the same prompt, free output). Each round measures a case right beside its
  own baseline (the order reversed every other round); each figure is the median of its
  per-round ratios (EXOD_BENCH_ROUNDS, 18 by default), printed with their range. A round is 8
  requests of 64 tokens on a machine whose speed moves over seconds: single rounds spread
  widely, and a median of 18 moves less between runs than one of 6 (bench/results/).
  Both sides generate MAX_TOKENS tokens: end of sequence is biased away, and no schema here can
  close that early. Goal: >= 0.9x at 8 clients.
- compile / decode step: the time to compile the grammar of a typical forced tool call (and
  compute its first mask, where llguidance builds its lexer), and of the 30 KB tool set, against
  one decode step at 1 client (1 / tok/s), and the same grammars again (copied from the runner's
  cache of compiled grammars). The one-off build of the engine's view of the tokenizer too.
- exod / mlx_lm.server on the same tool-call request (tool_choice required, sampled): how many
  answers carry a tool call whose arguments validate against the tool's parameters. mlx_lm.server
  parses calls but enforces nothing.

The model: the demo model's tokenizer and chat template (49,152 tokens, with tools) on a tiny
random body (tests.models.tiny.with_tiny_body): a mask costs what it costs with the real
vocabulary, and a step is as short as a fast machine makes the real model's, so what the grammar
adds shows. On this CPU the real demo model's step is so long that any grammar looks free.
`EXOD_BENCH_MODEL=DIR` measures another model directory (with its own tokenizer) instead.

Run alone with `python -m bench agent_constrained`; `python -m bench agent` runs it too.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai

from bench.api import demo_model
from bench.common import PY, REPO, report, Row
from bench.results import Figure
from tests.harness import Daemon, cpu_seconds

MAX_TOKENS = 64
LEVELS = (1, 8)
ROUNDS = int(os.environ.get("EXOD_BENCH_ROUNDS", "18"))
GOAL = 0.9
TRIES = 8
EOS_AWAY = {"2": -100}  # SmolLM2's <|im_end|>
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 24},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 14},
    "include": {"type": "array", "items": {"enum": ["wind", "rain", "uv"]}, "maxItems": 3}},
    "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather forecast for a city",
    "parameters": WEATHER}}]
ASK = [{"role": "user", "content": "What is the weather in Oslo for the next 3 days?"}]


def _format(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"response_format": {"type": "json_schema", "json_schema": {"name": name,
                                                                       "schema": schema}}}


# Schemas too long to close within MAX_TOKENS (minItems, minLength): both sides generate exactly
# MAX_TOKENS tokens.
STRINGS = {"type": "object", "properties": {"items": {
    "type": "array", "items": {"type": "string", "maxLength": 16}, "minItems": 64}},
    "required": ["items"]}
PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"},
    "score": {"type": "number"},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 4},
    "address": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 20},
        "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["city", "zip"]}},
    "required": ["name", "age", "score", "tags", "address"]}
NESTED = {"type": "object", "properties": {"people": {"type": "array", "items": PERSON,
                                                      "minItems": 20}},
          "required": ["people"]}
LONG = {"type": "object", "properties": {"story": {"type": "string", "minLength": 4096}},
        "required": ["story"]}


def pydantic_schema() -> dict[str, Any]:
    """A response model as instructor-style code writes it, schema by pydantic itself."""
    from typing import Literal

    from pydantic import BaseModel, Field

    class Step(BaseModel):
        action: Literal["read", "edit", "run", "ask"]
        target: str = Field(max_length=40)
        why: str | None = Field(default=None, max_length=80)

    class Plan(BaseModel):
        goal: str = Field(max_length=80)
        steps: list[Step] = Field(min_length=16)
        confidence: float

    return Plan.model_json_schema()


def tool_set(kib: int = 30) -> list[dict[str, Any]]:
    """Tools as an agent sends them (descriptions, enums, nested objects, arrays), about `kib`
    KiB as compact JSON."""
    tools: list[dict[str, Any]] = []
    while len(json.dumps(tools, separators=(",", ":"))) < kib * 1024:
        i = len(tools)
        tools.append({"type": "function", "function": {
            "name": f"tool_{i}_{['read', 'write', 'search', 'run'][i % 4]}",
            "description": f"Tool number {i}: does one thing to the workspace, and reports "
                           "what it did. Use it when the task calls for it; never guess paths.",
            "parameters": {"type": "object", "properties": {
                "path": {"type": "string", "maxLength": 64,
                         "description": "A path relative to the workspace root"},
                # What a Write or Edit tool carries. Required and long, so that no call closes
                # within MAX_TOKENS: a call that closed early would end its answer, and its
                # tokens/s would then weigh the 30 KB prompt's prefill over fewer tokens than
                # its baseline's (a gap in the figure that is no cost of the grammar).
                "content": {"type": "string", "minLength": 512,
                            "description": "The text to write, whole"},
                "mode": {"type": "string", "enum": ["fast", "full", "dry"]},
                "limit": {"type": "integer", "minimum": 1, "maximum": 1000},
                "pattern": {"type": "string", "maxLength": 32},
                "flags": {"type": "array", "items": {"type": "string", "maxLength": 12},
                          "maxItems": 4},
                "options": {"type": "object", "properties": {
                    "recursive": {"type": "boolean"},
                    "depth": {"type": "integer", "maximum": 32},
                    "encoding": {"type": "string", "enum": ["utf-8", "latin-1"]}}}},
                "required": ["path", "mode", "content"]}}})
    return tools


@dataclass(frozen=True)
class Case:
    name: str
    side: dict[str, Any]  # the constrained request's fields
    base: dict[str, Any]  # its baseline's (the same prompt, free output)


def cases() -> list[Case]:
    tools = tool_set()
    return [
        Case("string array (maxLength 16)", _format("strings", STRINGS), {}),
        Case("nested objects", _format("nested", NESTED), {}),
        Case("pydantic response model", _format("plan", pydantic_schema()), {}),
        Case("long free string", _format("story", LONG), {}),
        Case("json_object", {"response_format": {"type": "json_object"}}, {}),
        Case(f"forced call, {len(tools)} tools "
             f"({len(json.dumps(tools, separators=(',', ':'))) >> 10} KiB)",
             {"tools": tools, "tool_choice": "required"}, {"tools": tools, "tool_choice": "none"}),
    ]


def aggregate(client: openai.OpenAI, clients: int, extra: dict[str, Any],
              runner: int | None = None) -> tuple[float, float]:
    """(tokens/s, the runner's CPU seconds per token) of `clients` concurrent chats."""
    def one(c: int) -> int:
        r = client.chat.completions.create(
            model="agent", messages=[{"role": "user", "content": f"Tell me about {c + 1} cats."}],
            max_tokens=MAX_TOKENS, temperature=0, logit_bias=EOS_AWAY, **extra)
        return r.usage.completion_tokens if r.usage else 0

    cpu = cpu_seconds(runner) if runner else 0.0
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        tokens = sum(pool.map(one, range(clients)))
    wall = time.perf_counter() - t0
    return tokens / wall, ((cpu_seconds(runner) - cpu) / tokens if runner else 0.0)


def side_by_side(client: openai.OpenAI, runner: int) -> tuple[list[Row], float]:
    """Every case against its baseline, at each level: (rows, seconds of one free decode step
    at 1 client). Each row: the median ratio of tokens/s (constrained / baseline) with its
    range, and the median ratio of the runner's CPU time per token (baseline / constrained):
    on a machine shared with other work, wall time moves with the neighbours, CPU time less.
    Each round measures a case right beside its own baseline (the order turned every round):
    one baseline shared by every case of a round put that one measurement's noise (this
    machine's speed moves over seconds) into all of the round's ratios at once."""
    rows: list[Row] = []
    step = 0.0
    for clients in LEVELS:
        for c in cases():  # warm: kernels, the grammar engine's tokenizer, each grammar
            aggregate(client, clients, c.base)
            aggregate(client, clients, c.side)
        free: list[float] = []
        for c in cases():
            rates: dict[str, list[float]] = {"side": [], "base": []}
            cpus: dict[str, list[float]] = {"side": [], "base": []}
            for r in range(ROUNDS):
                for which in (("base", "side") if r % 2 == 0 else ("side", "base")):
                    rate, cpu = aggregate(client, clients, getattr(c, which), runner)
                    rates[which].append(rate)
                    cpus[which].append(cpu)
            ratios = [a / b for a, b in zip(rates["side"], rates["base"], strict=True)]
            cpu = [b / a for a, b in zip(cpus["side"], cpus["base"], strict=True)]
            mid = statistics.median(ratios)
            if not c.base:
                free += rates["base"]
            rows.append(Figure(f"{c.name}, {clients} client(s)", mid, rounds=ratios,
                               sides={"constrained": statistics.median(rates["side"]),
                                      "free": statistics.median(rates["base"])},
                               side_unit="tok/s",
                               text=f"CPU per token {statistics.median(cpu):.3f}x",
                               goal=f">= {GOAL}x" if clients > 1 else None))
        if clients == 1:
            step = 1 / statistics.median(free)
    return rows, step


def engine_costs(model: Path) -> dict[str, float]:
    """`costs_here(model)` in a subprocess: this process never imports mlx."""
    code = f"from bench.agent_constrained import costs_here; costs_here({str(model)!r})"
    res = subprocess.run([PY, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    costs: dict[str, float] = json.loads(res.stdout.strip().splitlines()[-1])
    return costs


def costs_here(model_dir: str) -> None:
    """Prints, as JSON: seconds to build llguidance's tokenizer once; the median seconds to
    compile a forced call's grammar with its first mask (a typical tool; the 30 KB tool set),
    the first time and again (a copy from the cache); and for each case, the CPU seconds the
    grammar takes per token (consume the token, compute the next mask's bits) on the thread
    that steps the batch, over MAX_TOKENS tokens chosen at random among those allowed (4
    tries, a warm cache). (Before 2026-12-04 this also timed unpacking the bits into a float
    row, which only the logits-processor path does: about half of the figure.)"""
    import random

    import numpy as np
    from mlx_lm.tokenizer_utils import load

    from exod.wire import messages as m
    from exod.wire.options import GrammarLimits
    from exod.runner.serving import grammar
    from exod.runner import formats

    model = Path(model_dir)
    tok = load(model)
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    g = grammar.Grammars(tok, vocab, GrammarLimits())
    t = time.perf_counter()
    g.ll_tokenizer("tools")
    out = {"setup": time.perf_counter() - t}

    def forced(tools: list[dict[str, Any]]) -> str:
        req = m.Generate(id="r", kind="chat", max_tokens=9, tools=tools, tool_choice="required")
        fmt = formats.format_of(tok)
        assert fmt is not None
        return fmt.grammar(formats.allowed(req), lambda s: g.literal(s, "tools"), "start")

    for name, tools in (("typical", TOOLS), ("30k", tool_set())):
        lark, first, again = forced(tools), [], []
        for _ in range(5):
            g._compiled.clear()  # compiled afresh, as the first request with these tools is
            t = time.perf_counter()
            g.compile(lark, "tools")
            first.append(time.perf_counter() - t)
            t = time.perf_counter()
            g.compile(lark, "tools")
            again.append(time.perf_counter() - t)
        out[name], out[name + " again"] = statistics.median(first), statistics.median(again)
    eos = set(int(e) for e in tok.eos_token_ids)
    for case in cases():
        fmt = case.side.get("response_format")
        spent, tokens = 0.0, 0
        for seed in range(5):
            c = g.json_schema({**fmt, "schema": fmt.get("json_schema", {}).get("schema")}) \
                if fmt else g.compile(forced(case.side["tools"]), "tools")
            rng = random.Random(seed)
            for _ in range(MAX_TOKENS):
                bits = np.unpackbits(c.words.view(np.uint8), bitorder="little")[:vocab]
                allowed = [i for i in np.flatnonzero(bits).tolist() if i not in eos]
                if not allowed:
                    break
                token = rng.choice(allowed)
                t = time.thread_time()
                c.matcher.consume_token(token)  # then the next mask, as the batch's round does
                c.matcher.unsafe_compute_mask_ptr(c.words.ctypes.data, c.words.nbytes)
                if seed:  # the first try warms the lexer, as the bench's warm-up does
                    spent += time.thread_time() - t
                    tokens += 1
        out[case.name] = spent / max(tokens, 1)
    print(json.dumps(out))


def valid_calls(client: openai.OpenAI, model: str) -> tuple[int, float]:
    """How many of TRIES sampled tool-call answers hold a call whose arguments validate, and
    the median tokens/s of an answer (answers differ in length: a call, or text)."""
    import jsonschema

    good, rates = 0, []
    for seed in range(TRIES):
        t = time.perf_counter()
        r = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS,
                                           tool_choice="required", temperature=1.0, seed=seed,
                                           max_tokens=96)
        rates.append((r.usage.completion_tokens if r.usage else 0) / (time.perf_counter() - t))
        for c in r.choices[0].message.tool_calls or []:
            try:
                jsonschema.validate(json.loads(c.function.arguments), WEATHER)
            except (ValueError, jsonschema.ValidationError):
                continue
            good += 1
            break
    return good, statistics.median(rates)


def against_mlx_lm_server(client: openai.OpenAI, model: Path) -> list[Row]:
    from bench.api import start_mlx_lm_server

    ours, our_rate = valid_calls(client, "agent")
    server, http = start_mlx_lm_server(model)
    try:
        other = openai.OpenAI(base_url=f"http://127.0.0.1:{http.port}/v1", api_key="-",
                              max_retries=0, timeout=600)
        theirs, their_rate = valid_calls(other, str(model))
    finally:
        server.terminate()
        server.wait(30)
    return [Figure("valid tool calls (required), exod", ours, unit="", text=f"of {TRIES}",
                   goal=f"== {TRIES}"),
            Figure("valid tool calls (required), mlx_lm.server", theirs, unit="",
                   text=f"of {TRIES} (not enforced)"),
            Figure("tok/s of an answer (prefill included), exod / mlx_lm.server",
                   our_rate / their_rate)]


def section(client: openai.OpenAI, model: Path, runner: int) -> list[Row]:
    costs = engine_costs(model)
    rows, step = side_by_side(client, runner)
    ms = 1e3
    rows += [Figure(f"grammar CPU per token on the stepping thread, {c.name}",
                    costs[c.name] * 1e6, unit="us",
                    text=f"{costs[c.name] / step:.3f}x a free decode step") for c in cases()]
    for name, what in (("typical", "a typical tool"), ("30k", "a 30 KB tool set")):
        rows += [Figure(f"grammar compile ({what}) / one decode step", costs[name] / step,
                        sides={"compile": costs[name] * ms, "step": step * ms}, side_unit="ms",
                        text=f"again, from the cache: {costs[name + ' again'] / step:.3f}x "
                             f"({costs[name + ' again'] * ms:.2f} ms)")]
    rows.append(Figure("grammar engine's tokenizer, built once per runner", costs["setup"],
                       unit="s"))
    report("agent: constrained decoding", rows)
    return against_mlx_lm_server(client, model)


def bench_model(tmp: Path) -> Path:
    """The model measured, with a tool template (see the module's docstring)."""
    from bench.common import model as made
    from tests.models.tiny import with_tool_template

    if os.environ.get("EXOD_BENCH_MODEL"):
        base = Path(os.environ["EXOD_BENCH_MODEL"])
    else:
        base = made("demo-tiny-body", tokenizer_from=demo_model(), layers=2, hidden=64,
                    intermediate=128, heads=2, kv_heads=1)
    return with_tool_template(base, tmp / "tools")


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-agent-") as tmp:
        model = bench_model(Path(tmp))
        d = Daemon({"instances": {"agent": {"model": str(model), "max_concurrency": 8}}},
                   name="bench-agent-constrained")
        d.start()
        try:
            runner = d.until_state("agent", "ready")["ranks"][0]["pid"]
            client = openai.OpenAI(base_url=d.api_url() + "/v1", api_key="-", max_retries=0,
                                   timeout=600)
            report("agent: tool calls, exod vs mlx_lm.server", section(client, model, runner))
        finally:
            d.close()


if __name__ == "__main__":
    main()
