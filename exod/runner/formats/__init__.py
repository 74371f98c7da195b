"""The ways models write tool calls and reasoning in their text, one class per format, found
for a model's tokenizer as mlx-lm finds them (its wrapper infers a parser from the chat
template: `tool_parser`, `tool_call_start`, `tool_call_end`), and harmony (gpt-oss) by its
tokens. Each format parses its calls (exod.runner.formats.splitter cuts them out of the
stream), forces them with a grammar written in the format itself, and adapts a conversation
to its template (ids, reasoning, one call a message).

Pure text work: mlx-lm's parsers are handed in by the tokenizer, never imported here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from exod.wire import messages as m
from exod.runner.formats import harmony, literals, tagged
from exod.runner.formats.base import (MAX_CALLS, Allowed, ParsedCall, Piece, Thought, ToolFormat,
                                      Transitions)
from exod.runner.formats.json_body import JsonTools, KimiK2, Mistral
from exod.runner.formats.splitter import Splitter

__all__ = ["MAX_CALLS", "Allowed", "ParsedCall", "Piece", "Splitter", "Thought", "ToolFormat",
           "Transitions", "allowed", "calls_allowed", "events", "format_of", "splitter",
           "text_thinking"]

# mlx-lm's parser module → the class that forces and adapts calls in that format (the rest
# are parsed, not forced).
KINDS: dict[str, type[ToolFormat]] = {"json_tools": JsonTools, "mistral": Mistral,
                                      "kimi_k2": KimiK2, **tagged.KINDS, **literals.KINDS}

_known: dict[int, tuple[Any, ToolFormat | None]] = {}  # by the tokenizer's id (it is kept)


def format_of(tokenizer: Any) -> ToolFormat | None:
    """The model's call format: None for a model that writes no calls exod can read."""
    kept = _known.get(id(tokenizer))
    if kept is not None and kept[0] is tokenizer:
        return kept[1]
    fmt = _find(tokenizer)
    _known[id(tokenizer)] = (tokenizer, fmt)
    return fmt


def _find(tokenizer: Any) -> ToolFormat | None:
    parse = getattr(tokenizer, "tool_parser", None)
    if getattr(tokenizer, "has_tool_calling", False) and parse is not None:
        kind = getattr(parse, "__module__", "").rsplit(".", 1)[-1]
        cls = KINDS.get(kind, ToolFormat)
        fmt = cls(kind, tokenizer.tool_call_start, tokenizer.tool_call_end or "", parse)
        if isinstance(fmt, Mistral):
            fmt = Mistral(kind, fmt.start, fmt.end, parse, _template(tokenizer))
        return fmt
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    if harmony.is_harmony(vocab):
        return harmony.Harmony("harmony", harmony.tool_call_start, harmony.tool_call_end,
                               harmony.parse_tool_call)
    return None


def _template(tokenizer: Any) -> str:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = "\n".join(t for t in template.values() if isinstance(t, str))
    return template if isinstance(template, str) else ""


def text_thinking(tokenizer: Any) -> tuple[str, str] | None:
    """Think markers found as text (several tokens each: Gemma 4's `<|channel>thought` ...
    `<channel|>`); single-token ones are found by their ids (exod.runner.serving.output)."""
    if not getattr(tokenizer, "has_thinking", False):
        return None
    ids = getattr(tokenizer, "think_start_tokens", None), getattr(tokenizer, "think_end_tokens",
                                                                   None)
    if all(t is not None and len(t) == 1 for t in ids):
        return None
    start, end = tokenizer.think_start, tokenizer.think_end
    return (start, end) if start and end else None


def calls_allowed(req: m.Generate) -> int:
    """How many calls a generation may make: one for a named tool_choice or without
    parallel_tool_calls, else MAX_CALLS."""
    return 1 if req.tool_choice == "function" or not req.parallel_tool_calls else MAX_CALLS


def allowed(req: m.Generate) -> Allowed:
    """The calls a forced grammar writes for `req` (tool_choice required or named)."""
    functions = tuple(t["function"] for t in req.tools
                      if req.tool_choice != "function" or t["function"]["name"] == req.tool_name)
    earlier = sum(len(msg.get("tool_calls") or ()) for msg in req.messages or ()
                  if isinstance(msg, dict))
    return Allowed(functions, calls_allowed(req), frozenset(req.strict_tools), earlier)


def splitter(tokenizer: Any, req: m.Generate, check: Any = None,
             prompt: Sequence[int] = ()) -> Splitter | None:
    """The splitter of a chat's output: one when the request may call its tools, or the model
    marks reasoning in its text (several-token markers, harmony's channels). `prompt`: its
    tokens, whose end may open a think block (Kimi K3's template does)."""
    if req.kind != "chat":
        return None
    fmt = format_of(tokenizer)
    tools = bool(req.tools) and req.tool_choice != "none" and fmt is not None
    initial, table = fmt.table(tools) if fmt is not None else ("normal", {})
    table = {state: list(edges) for state, edges in table.items()}
    think = text_thinking(tokenizer)
    if think is not None:
        table.setdefault("normal", []).append((think[0], "reasoning"))
        table.setdefault("reasoning", []).append((think[1], "normal"))
        if initial == "normal" and opens(tokenizer, prompt, think):
            initial = "reasoning"
    if not table:
        return None
    return Splitter(initial, table, fmt, req.tools if tools else None, calls_allowed(req),
                    req.id, check)


def opens(tokenizer: Any, prompt: Sequence[int], think: tuple[str, str]) -> bool:
    """The prompt ends inside a think block (its last start after its last end), read in
    the text of its last tokens: a generation prompt that opens one is short."""
    if not prompt:
        return False
    tail = tokenizer.decode(list(prompt[-TAIL:]))
    return tail.rfind(think[0]) > tail.rfind(think[1])


TAIL = 64  # tokens of the prompt's end in which an opened think block is looked for


def events(rid: str, pieces: list[Piece]) -> list[m.Event]:
    out: list[m.Event] = []
    for p in pieces:
        if isinstance(p, ParsedCall):
            out.append(m.ToolCall(rid, p.name, p.arguments, p.id))
        elif isinstance(p, Thought):
            out.append(m.Text(rid, "", p.text))
        elif p:
            out.append(m.Text(rid, p))
    return out
