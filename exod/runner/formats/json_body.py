"""Formats whose calls carry their arguments as one JSON object: json_tools (Qwen, Hermes),
Mistral's (three generations of it) and Kimi K2's. Parsed by mlx-lm's parsers, except
Mistral's `[CALL_ID]`, which mlx-lm 0.32 reads as the tool's name.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import string
from dataclasses import dataclass
from typing import Any

from exod.runner.formats.base import Allowed, Literal, ParsedCall, ToolFormat, Transitions, calls_of
from exod.runner.formats.grammar_parts import choice, json_args, quoted, repeat


@dataclass(frozen=True)
class JsonTools(ToolFormat):
    """`<tool_call>\\n{"name": NAME, "arguments": ARGS}\\n</tool_call>`, one after another."""

    def grammar(self, allowed: Allowed, lit: Literal, top: str) -> str:
        def fn(i: int, f: dict[str, Any]) -> list[str]:
            head = quoted(f'{{"name":{json.dumps(f["name"])},"arguments":')
            return [f'fn_{i}: {head} args_{i} "}}"\n', f"args_{i}: {json_args(f, allowed)}\n"]
        return (f"{top}: {repeat('call', quoted(chr(10)), allowed.most)}\n"
                f'call: {lit(self.start)} "\\n" call_body "\\n" {lit(self.end)}\n'
                + "".join(choice(allowed, fn)))


_ALNUM = string.ascii_letters + string.digits
_MISTRAL_ID = re.compile(r"[A-Za-z0-9]{9}")
_HEADER = re.compile(r"\s*([\w.-]+)\s*(?:\[CALL_ID\]\s*([A-Za-z0-9]+)\s*)?\[ARGS\]\s*", re.S)


@dataclass(frozen=True)
class Mistral(ToolFormat):
    """Three generations, as the template writes them: `[TOOL_CALLS]NAME[CALL_ID]ID[ARGS]ARGS`
    (Mistral Small 3.2: ids of nine letters and digits, which the template demands back),
    `[TOOL_CALLS]NAME[ARGS]ARGS` (Devstral, Ministral 3), and the first, a JSON array after
    `[TOOL_CALLS]` (Mistral 7B v0.3, Nemo). Each call of the first two opens with its own
    `[TOOL_CALLS]`; there is no end marker: the calls end the turn."""

    template: str = ""

    @property
    def generation(self) -> str:
        if "[CALL_ID]" in self.template:
            return "call_id"
        return "args" if "[ARGS]" in self.template else "array"

    def table(self, tools: bool) -> tuple[str, Transitions]:
        if not tools:
            return "normal", {}
        # A call ends where the next one opens (or at the end of the turn).
        return "normal", {"normal": [(self.start, "tool")], "tool": [(self.start, "tool")]}

    def parse(self, body: str, tools: Any) -> list[ParsedCall]:
        if body.lstrip().startswith("["):  # the first generation's array
            return calls_of(self.parse_text(body, tools))
        out = []
        decoder = json.JSONDecoder()
        at = 0
        while (m := _HEADER.match(body, at)) is not None:
            args, at = decoder.raw_decode(body, m.end())
            call = calls_of({"name": m.group(1), "arguments": args})[0]
            given = m.group(2) or ""
            out.append(ParsedCall(call.name, call.arguments,
                            given if _MISTRAL_ID.fullmatch(given) else self.new_id()))
            at = len(body) - len(body[at:].lstrip())
        if not out or body[at:].strip():
            raise ValueError("not a call of this format")
        return out

    def new_id(self) -> str:
        return "".join(secrets.choice(_ALNUM) for _ in range(9))

    def grammar(self, allowed: Allowed, lit: Literal, top: str) -> str:
        if self.generation == "array":
            def item(i: int, f: dict[str, Any]) -> list[str]:
                head = quoted(f'{{"name":{json.dumps(f["name"])},"arguments":')
                return [f'fn_{i}: {head} args_{i} "}}"\n',
                        f"args_{i}: {json_args(f, allowed)}\n"]
            return (f'{top}: {lit(self.start)} "[" {repeat("call_body", quoted(","), allowed.most)}'
                    ' "]"\n' + "".join(choice(allowed, item)))
        # The markers may be special tokens (they are, in Mistral's vocabularies): as such.
        call_id = f" {lit('[CALL_ID]')} /[A-Za-z0-9]{{9}}/" if self.generation == "call_id" \
            else ""
        args = lit("[ARGS]")

        def header(i: int, f: dict[str, Any]) -> list[str]:
            return [f'fn_{i}: {quoted(f["name"])}{call_id} {args} args_{i}\n',
                    f"args_{i}: {json_args(f, allowed)}\n"]
        return (f"{top}: {repeat('call', '', allowed.most)}\n"
                f"call: {lit(self.start)} call_body\n" + "".join(choice(allowed, header)))

    def messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The template of the `call_id` generation refuses any id but nine letters and digits:
        every other id becomes one, the same for a call and its result."""
        if self.generation != "call_id":
            return messages
        out = []
        for msg in messages:
            calls = msg.get("tool_calls")
            if calls:
                msg = {**msg, "tool_calls": [{**c, "id": _nine(c.get("id"))} for c in calls]}
            if msg.get("role") == "tool":
                msg = {**msg, "tool_call_id": _nine(msg.get("tool_call_id"))}
            out.append(msg)
        return out


def _nine(given: Any) -> str:
    """An id of nine letters and digits: the id itself if it is one, else one made from it."""
    text = str(given or "")
    if _MISTRAL_ID.fullmatch(text):
        return text
    n = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")
    out = ""
    for _ in range(9):
        n, r = divmod(n, len(_ALNUM))
        out += _ALNUM[r]
    return out


@dataclass(frozen=True)
class KimiK2(ToolFormat):
    """`<|tool_calls_section_begin|>`, then each call as `<|tool_call_begin|>functions.NAME:N
    <|tool_call_argument_begin|>ARGS<|tool_call_end|>`, then `<|tool_calls_section_end|>`.
    N counts the calls of the whole conversation, as Kimi's template numbers them."""

    def grammar(self, allowed: Allowed, lit: Literal, top: str) -> str:
        begin, args, end = (lit(t) for t in ("<|tool_call_begin|>", "<|tool_call_argument_begin|>",
                                              "<|tool_call_end|>"))
        rules = [f"{top}: {lit(self.start)} call_0 {lit(self.end)}\n"]
        for k in range(allowed.most):  # the k-th call of the turn: its own number
            more = f" call_{k + 1}?" if k + 1 < allowed.most else ""
            rules.append(f"call_{k}: {begin} body_{k} {end}{more}\n")
            names = [quoted(f"functions.{f['name']}:{allowed.earlier + k}")
                     for f in allowed.functions]
            rules.append(f"body_{k}: " + " | ".join(f"{name} {args} args_{i}"
                                                    for i, name in enumerate(names)) + "\n")
        rules += [f"args_{i}: {json_args(f, allowed)}\n"
                  for i, f in enumerate(allowed.functions)]
        return "".join(rules)
