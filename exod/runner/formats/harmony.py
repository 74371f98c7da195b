"""OpenAI's harmony format (gpt-oss), which mlx-lm does not parse. A turn is a run of messages,
each `<|start|>assistant` (the prompt ends with the first one), a header and a body (the second
message here is on two lines, in the text on one):

    <|channel|>analysis<|message|>reasoning<|end|>
    <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>ARGS
    <|call|>
    <|start|>assistant<|channel|>final<|message|>answer<|return|>

`<|call|>` and `<|return|>` end the generation (end-of-sequence tokens in gpt-oss's generation
config). The recipient may also come before the channel, as gpt-oss's own template writes past
calls: both are read. A commentary message without a recipient (a preamble) is answer text.

Written on mlx-lm's interfaces (`mlx_lm.tool_parsers`' module-level functions, `RESPONSE_FORMAT`
in the shape of `mlx_lm.chat_templates`), so it can go upstream as it is.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from exod.core import context_edits
from exod.runner.formats.base import Allowed, Literal, ToolFormat, Transitions
from exod.runner.formats.grammar_parts import json_args, quoted

tool_call_start = "to="  # a recipient, in a message's header
tool_call_end = "<|call|>"

RESPONSE_FORMAT: dict[str, Any] = {
    "initial_state": "header",
    "transitions": {
        # The earliest marker wins; of two at one place, the longer (exod.runner.formats.splitter).
        "header": [("<|channel|>analysis<|message|>", "reasoning"), (tool_call_start, "tool"),
                   ("<|message|>", "normal")],
        # A message ends at <|end|>; one that runs into the next header ends there too.
        "reasoning": [("<|end|>", "header"), ("<|start|>", "header"), ("<|channel|>", "header"),
                      ("<|return|>", "header"), ("<|call|>", "header")],
        "normal": [("<|end|>", "header"), ("<|return|>", "header"), ("<|start|>", "header"),
                   ("<|channel|>", "header"), ("<|call|>", "header"),
                   ("<|constrain|>", "normal"), ("<|message|>", "normal")],
        "tool": [(tool_call_end, "header"), ("<|end|>", "header"), ("<|start|>", "header")],
    },
}

# The tokens that make a tokenizer harmony's (all special in gpt-oss's o200k_harmony).
TOKENS = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|call|>")
_RECIPIENT = re.compile(r"\s*(?:functions\.)?([^\s<]+)")


def parse_tool_call(text: str, tools: Any = None) -> dict[str, Any]:
    """A message to a function: `NAME`, the rest of its header, `<|message|>`, the arguments.
    The recipient must be one of `functions` (not a built-in tool, `python` or `browser.*`)."""
    head, sep, body = text.partition("<|message|>")
    found = _RECIPIENT.match(head)
    if not sep or found is None or not head.lstrip().startswith("functions."):
        raise ValueError("not a message to a function")
    body = body.strip()
    for end in (tool_call_end, "<|end|>"):
        body = body.removesuffix(end).rstrip()
    return {"name": found.group(1), "arguments": json.loads(body) if body else {}}


def is_harmony(vocab: set[str] | dict[str, int]) -> bool:
    return all(t in vocab for t in TOKENS)


@dataclass(frozen=True)
class Harmony(ToolFormat):
    """gpt-oss's format: reasoning in the analysis channel, calls in the commentary channel,
    the answer in the final channel."""

    def markup(self) -> tuple[str, ...]:
        return (*TOKENS, "<|constrain|>", "<|return|>")

    def table(self, tools: bool) -> tuple[str, Transitions]:
        # Calls sit in the turn's structure: without tools they are still cut out (and dropped).
        return RESPONSE_FORMAT["initial_state"], RESPONSE_FORMAT["transitions"]

    def grammar(self, allowed: Allowed, lit: Literal, top: str) -> str:
        """One call (a call ends the turn), with `<|constrain|>json`, as harmony's model output
        is written; any reasoning before it is the caller's (exod.runner.serving.think_grammar,
        with `thinking()`)."""
        alts = " | ".join(f"fn_{i}" for i in range(len(allowed.functions)))
        rules = [f'{top}: {lit("<|channel|>")} "commentary to=functions." call_body\n',
                 f"call_body: {alts}\n"]
        for i, f in enumerate(allowed.functions):
            rules.append(f'fn_{i}: {quoted(f["name"])} " " {lit("<|constrain|>")} "json" '
                         f"{lit('<|message|>')} args_{i} {lit(tool_call_end)}\n")
            rules.append(f"args_{i}: {json_args(f, allowed)}\n")
        return "".join(rules)

    def answer(self, lit: Literal) -> str | None:
        """What comes before a constrained answer: the final channel."""
        return f'{lit("<|channel|>")} "final" {lit("<|message|>")}'

    def thinking(self, lit: Literal) -> tuple[str, str] | None:
        """The analysis message, as Lark: its start and its end (up to the next header)."""
        return (f'{lit("<|channel|>")} "analysis" {lit("<|message|>")}',
                f'{lit("<|end|>")} {lit("<|start|>")} "assistant"')

    def messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """As gpt-oss's template takes a conversation: one system turn, first (it renders only
        the first as the developer message, and drops the others without a word: agents put
        theirs anywhere), an assistant's reasoning under `thinking`, one call a message (the
        template renders only the first, and names a tool's result after the last call before
        it), each call followed by its result."""
        messages = context_edits.system_first(messages)
        out: list[dict[str, Any]] = []
        results = {m.get("tool_call_id"): m for m in messages if m.get("role") == "tool"}
        placed: set[int] = set()
        for msg in messages:
            if msg.get("role") == "tool":
                if id(msg) not in placed:
                    out.append(msg)
                continue
            if msg.get("role") != "assistant":
                out.append(msg)
                continue
            msg = _thinking({**msg, "content": msg.get("content") or ""})  # the template reads it
            calls = msg.get("tool_calls") or []
            if len(calls) <= 1:
                out.append(msg)
                continue
            for k, call in enumerate(calls):
                part = {**msg, "tool_calls": [call]}
                if k:  # the reasoning and text belong before the first call
                    part = {"role": "assistant", "content": "", "tool_calls": [call]}
                out.append(part)
                result = results.get(call.get("id"))
                if result is not None and k + 1 < len(calls):
                    out.append(result)
                    placed.add(id(result))
        return out


def _thinking(msg: dict[str, Any]) -> dict[str, Any]:
    """An assistant message's reasoning under `thinking`, where gpt-oss's template reads it;
    with a call, the template takes text or reasoning, not both: the text joins the reasoning."""
    reasoning = msg.get("reasoning_content") or msg.get("thinking")
    if not reasoning:
        return msg
    out = {k: v for k, v in msg.items() if k != "reasoning_content"}
    out["thinking"] = reasoning
    if out.get("tool_calls") and out.get("content"):
        out["thinking"] = f"{reasoning}\n\n{out['content']}"
        out["content"] = ""
    return out
