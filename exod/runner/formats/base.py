"""What every tool-call format is made of: the calls it writes, how many a forced grammar allows,
and the table of markers by which a model's output moves between its parts (answer, reasoning,
a call, a header that is never shown). Pure: no mlx, no engine.

The table has the shape of mlx-lm's response formats (`mlx_lm.chat_templates.*.RESPONSE_FORMAT`:
a state's list of `(marker, next state)`), so a format written here can go upstream as it is.
States: `normal` (the answer), `reasoning`, `tool` (a call's text, parsed when it ends), and any
other name (a header: dropped).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

# Calls a generation may make at most, forced or not, where the request allows more than one
# (`parallel_tool_calls`): agents ask for a handful at a time, and a model that would call
# without end (a random one does) is stopped here rather than at max_tokens.
MAX_CALLS = 16

Transitions = dict[str, list[tuple[str, str]]]
Parse = Callable[[str, Any], Any]  # mlx-lm's parse_tool_call(text, tools)
Literal = Callable[[str], str]  # text as a Lark expression: special tokens as themselves


@dataclass(frozen=True)
class ParsedCall:
    """A tool call as the format's parser found it in the model's text."""

    name: str
    arguments: str  # a JSON object's text
    id: str = ""  # the id the format gives the call (Mistral's nine characters); "": the API's


@dataclass(frozen=True)
class Thought:
    """Reasoning found in the text by its markers (several tokens each, or a channel)."""

    text: str


Piece = str | Thought | ParsedCall


@dataclass(frozen=True)
class Allowed:
    """What a forced grammar writes: calls of `functions` (OpenAI function objects), at most
    `most` of them; `strict`: the names of the tools whose parameters are enforced whole.
    `earlier`: calls in the conversation before this turn (Kimi numbers its calls)."""

    functions: tuple[dict[str, Any], ...]
    most: int
    strict: frozenset[str] = frozenset()
    earlier: int = 0


def calls_of(parsed: Any) -> list[ParsedCall]:
    """mlx-lm's parse result (a dict, or a list of them) as calls: ValueError for what is not
    one (no name, arguments that are not an object)."""
    out = []
    for c in parsed if isinstance(parsed, list) else [parsed]:
        if not isinstance(c, dict) or not isinstance(c.get("name"), str) or not c["name"]:
            raise ValueError("a call without a name")
        args = c.get("arguments", {})
        if args is None:
            args = {}
        if isinstance(args, str):
            args = json.loads(args) if args.strip() else {}
        if not isinstance(args, dict):
            raise ValueError("arguments that are not a JSON object")
        out.append(ParsedCall(c["name"], json.dumps(args, ensure_ascii=False)))
    if not out:
        raise ValueError("no call in it")
    return out


@dataclass(frozen=True)
class ToolFormat:
    """A model's way of writing calls: between `start` and `end` (`end` empty: calls run to the
    end of the turn), parsed by `parse` (mlx-lm's parser for the format, or exod's where mlx-lm
    has none). Subclasses write the forced grammar and adapt the conversation to the template."""

    kind: str
    start: str
    end: str
    parse_text: Parse = field(compare=False)
    # Markers that stay in a call's text when they open or close it (the parser reads them).
    kept: ClassVar[tuple[str, ...]] = ()

    def parse(self, body: str, tools: Any) -> list[ParsedCall]:
        """The calls in the text between the markers: ValueError (or the parser's own
        exceptions) for text that holds none."""
        return calls_of(self.parse_text(body, tools))

    def grammar(self, allowed: Allowed, lit: Literal, top: str) -> str:
        """Lark rules (llguidance's dialect) whose rule `top` writes the calls allowed,
        exactly as the model's own template writes a call (up to whitespace)."""
        raise NotImplementedError(f"{self.kind}: calls cannot be forced")

    @property
    def forceable(self) -> bool:
        return type(self).grammar is not ToolFormat.grammar

    def thinking(self, lit: Literal) -> tuple[str, str] | None:
        """The format's own reasoning markers, as Lark (None: the tokenizer's, if any)."""
        return None

    def answer(self, lit: Literal) -> str | None:
        """What a constrained answer (response_format) is written after, as Lark (harmony's
        final channel); None: nothing."""
        return None

    def messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The conversation as the model's template takes it (ids, reasoning, one call a turn):
        the same list when nothing changes."""
        return messages

    def markup(self) -> tuple[str, ...]:
        """The format's markers: none ever reaches the answer (a stray one is dropped)."""
        return tuple(m for m in (self.start, self.end) if m)

    def table(self, tools: bool) -> tuple[str, Transitions]:
        """The initial state and the transitions of the model's output: a call starts at
        `start` and ends at `end` (`tools`: the request may call; else calls are text).
        Every other marker of the format is dropped from the answer where it strays."""
        if not tools:
            return "normal", {}
        stray = [(m, "normal") for m in self.markup() if m != self.start]
        return "normal", {"normal": [(self.start, "tool"), *stray],
                          "tool": [(self.end, "normal")] if self.end else []}
