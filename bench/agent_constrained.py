"""Constrained decoding (issue 21): what a grammar costs, and what it buys. One daemon serving
the demo model with a tool-calling chat template (tests.models.tiny.with_tool_template).

- constrained / free: aggregate decode tokens/s of requests whose output follows a JSON
  schema (response_format) against the same requests unconstrained, at 1 and 8 concurrent
  clients, ABBA on one instance as bench.agent does. Both sides generate MAX_TOKENS tokens (the
  schema's one string cannot close that early, end of sequence is biased away). Goal: >= 0.9x.
- compile / decode step: the time to compile the grammar of a typical forced tool call (and
  compute its first mask, where llguidance builds its lexer) against one decode step at 1
  client (1 / tok/s). The one-off build of the engine's view of the tokenizer is printed too.
- exod / mlx_lm.server on the same tool-call request (tool_choice required, sampled): how many
  answers carry a tool call whose arguments validate against the tool's parameters. mlx_lm.server
  parses calls but enforces nothing.

Run alone with `python -m bench agent_constrained`; bench.agent calls `section` too.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai

from bench.api import demo_model
from bench.common import PY, report, verdict
from tests.harness import Daemon

MAX_TOKENS = 64
LEVELS = (1, 8)
ROUNDS = int(os.environ.get("EXOD_BENCH_ROUNDS", "4"))
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
# A string too long to close within MAX_TOKENS: both sides generate exactly MAX_TOKENS tokens.
LONG = {"type": "json_schema", "json_schema": {"name": "story", "schema": {
    "type": "object", "properties": {"story": {"type": "string", "minLength": 4096}},
    "required": ["story"]}}}


def aggregate(client: openai.OpenAI, clients: int, extra: dict[str, Any]) -> float:
    def one(c: int) -> int:
        r = client.chat.completions.create(
            model="agent", messages=[{"role": "user", "content": f"Tell me about {c + 1} cats."}],
            max_tokens=MAX_TOKENS, temperature=0, logit_bias=EOS_AWAY, **extra)
        return r.usage.completion_tokens if r.usage else 0

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        tokens = sum(pool.map(one, range(clients)))
    return tokens / (time.perf_counter() - t0)


def constrained_vs_free(client: openai.OpenAI) -> tuple[list[tuple[str, str]], float]:
    rows, step = [], 0.0
    constrained = {"response_format": LONG}
    for clients in LEVELS:
        aggregate(client, clients, constrained)  # warm: kernels, the grammar engine's tokenizer
        ratios, free = [], []
        for r in range(ROUNDS):
            if r % 2 == 0:
                a, b = aggregate(client, clients, constrained), aggregate(client, clients, {})
            else:
                b, a = aggregate(client, clients, {}), aggregate(client, clients, constrained)
            ratios.append(a / b)
            free.append(b)
        mid = statistics.median(ratios)
        rows.append((f"constrained / free, {clients} client(s), tok/s",
                     f"{mid:.3f}x (rounds {min(ratios):.3f}-{max(ratios):.3f}; goal >= {GOAL}x)"
                     f" {verdict(mid >= GOAL)}"))
        if clients == 1:
            step = 1 / statistics.median(free)
    return rows, step


def compile_time(model: Path) -> tuple[float, float]:
    """(seconds to build llguidance's tokenizer once, median seconds to compile a forced call's
    grammar and its first mask), in a subprocess: this process never imports mlx."""
    code = f"""
import json, statistics, time
from pathlib import Path
from mlx_lm.tokenizer_utils import load
from exod import messages as m
from exod.config.schema import GrammarLimits
from exod.runner.serving.grammar import Grammars
from exod.runner.serving.tool_calls import ToolFormat, forced_grammar
tok = load(Path({str(model)!r}))
g = Grammars(tok, json.load(open({str(model / "config.json")!r}))["vocab_size"], GrammarLimits())
t = time.perf_counter(); g.ll_tokenizer("tools"); setup = time.perf_counter() - t
req = m.Generate(id="r", kind="chat", max_tokens=9, tools={TOOLS!r}, tool_choice="required")
lark = forced_grammar(ToolFormat.of(tok), req, lambda s: g.literal(s, "tools"))
times = []
for _ in range(20):
    t = time.perf_counter(); g.compile(lark, "tools"); times.append(time.perf_counter() - t)
print(json.dumps([setup, statistics.median(times)]))
"""
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, check=True)
    setup, compiled = json.loads(out.stdout.strip().splitlines()[-1])
    return setup, compiled


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


def against_mlx_lm_server(client: openai.OpenAI, model: Path) -> list[tuple[str, str]]:
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
    return [("valid tool calls (required), exod", f"{ours}/{TRIES} {verdict(ours == TRIES)}"),
            ("valid tool calls (required), mlx_lm.server", f"{theirs}/{TRIES} (not enforced)"),
            ("tok/s of an answer (prefill included), exod / mlx_lm.server",
             f"{our_rate / their_rate:.2f}x")]


def section(client: openai.OpenAI, model: Path) -> list[tuple[str, str]]:
    setup, compiled = compile_time(model)
    rows, step = constrained_vs_free(client)
    rows += [("grammar compile (typical tool schema) / one decode step",
              f"{compiled / step:.3f}x ({compiled * 1e3:.2f} ms / {step * 1e3:.2f} ms)"),
             ("grammar engine's tokenizer, built once per runner", f"{setup:.2f} s")]
    report("agent: constrained decoding", rows)
    return against_mlx_lm_server(client, model)


def main() -> None:
    from tests.models.tiny import with_tool_template

    base = Path(os.environ["EXOD_BENCH_MODEL"]) if os.environ.get("EXOD_BENCH_MODEL") \
        else demo_model()
    with tempfile.TemporaryDirectory(prefix="bench-agent-") as tmp:
        model = with_tool_template(base, Path(tmp) / "tools")
        d = Daemon({"instances": {"agent": {"model": str(model), "max_concurrency": 8}}},
                   name="bench-agent-constrained")
        d.start()
        try:
            d.until_state("agent", "ready")
            client = openai.OpenAI(base_url=d.api_url() + "/v1", api_key="-", max_retries=0,
                                   timeout=600)
            report("agent: tool calls, exod vs mlx_lm.server", section(client, model))
        finally:
            d.close()


if __name__ == "__main__":
    main()
