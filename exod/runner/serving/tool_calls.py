"""Tool calls in a model's output, in the model's own format: found with mlx-lm's parser for the
model (`mlx_lm.tool_parsers`, as mlx-lm's tokenizer wrapper infers it from the chat template:
`tool_call_start`, `tool_call_end`, `tool_parser`), and forced, for `tool_choice` required or
named, by a grammar (exod.runner.serving.grammar) that writes a call in that same format.

The splitter is pure (the parser is handed to it), so it is unit-tested on its own.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from exod import messages as m
from exod.core.request_rules import RequestError
from exod.runner.log import WARNING, log
from exod.runner.serving import json_bounds
from exod.runner.serving.strict_args import ArgsCheck
from exod.core.text import clip

# The formats whose calls a grammar can write: the parser's module in mlx_lm.tool_parsers →
# how the calls sit between the markers. Others are parsed, not forced.
FORCEABLE = ("json_tools", "mistral")


@dataclass(frozen=True)
class ToolFormat:
    """How a model writes tool calls: its markers, mlx-lm's parser, the parser's name."""

    start: str
    end: str
    parse: Callable[[str, Any], Any]
    kind: str

    @classmethod
    def of(cls, tokenizer: Any) -> ToolFormat | None:
        if not getattr(tokenizer, "has_tool_calling", False):
            return None
        parse = tokenizer.tool_parser
        kind = getattr(parse, "__module__", "").rsplit(".", 1)[-1]
        return cls(tokenizer.tool_call_start, tokenizer.tool_call_end or "", parse, kind)


def check(fmt: ToolFormat | None, req: m.Generate) -> None:
    """A request's tools against the model: RequestError naming the field it cannot take."""
    if req.tools and fmt is None:
        raise RequestError("`tools`: this model's chat template has no tool support (mlx-lm "
                           "finds no tool-call format in it)", "tools")
    if req.tool_choice in ("required", "function") and fmt is not None \
            and fmt.kind not in FORCEABLE:
        raise RequestError(f"`tool_choice`: this model writes tool calls as {fmt.kind}, which "
                           "exod cannot force yet (it forces "
                           f"{', '.join(FORCEABLE)}); use \"auto\"", "tool_choice")


def forced_grammar(fmt: ToolFormat, req: m.Generate, literal: Callable[[str], str],
                   top: str = "start") -> str:
    """A Lark grammar (llguidance's dialect) of one call (or, with parallel_tool_calls, one or
    more) of the tools `req` allows, in the model's format. `literal(text)` spells a marker
    (a quoted string, or the special token it is). `top`: the name of its first rule (another
    grammar may put something before it: exod.runner.serving.grammar.Thinking).

    A call is `{"name":NAME,"arguments":ARGS}`, compact, with ARGS a JSON schema of its own
    (exod.runner.serving.json_bounds): the tool's parameters are the root of that schema, so
    their local `$ref`s (pydantic's `#/$defs/...`) resolve as the client meant."""
    allowed = [t["function"] for t in req.tools
               if req.tool_choice != "function" or t["function"]["name"] == req.tool_name]
    strict = set(req.strict_tools)
    rules = [f"call_body: {' | '.join(f'fn_{i}' for i in range(len(allowed)))}\n"]
    for i, f in enumerate(allowed):
        params = f.get("parameters")
        if not isinstance(params, dict) or not params:
            params = {"type": "object"}
        head = json.dumps(f'{{"name":{json.dumps(f["name"])},"arguments":')
        rules.append(f'fn_{i}: {head} args_{i} "}}"\n')
        # Lenient (keywords the engine does not implement left out) unless the tool is strict,
        # in which case its parameters were compiled whole first (strict_args: else a 400).
        rules.append(f"args_{i}: {json_bounds.json_rule(params, f['name'] in strict)}\n")
    start = literal(fmt.start)
    if fmt.kind == "mistral":  # [TOOL_CALLS] then a JSON array of calls
        more = ' ("," call_body)*' if req.parallel_tool_calls else ""
        return f'{top}: {start} "[" call_body{more} "]"\n' + "".join(rules)
    more = ' ("\\n" call)*' if req.parallel_tool_calls else ""
    return (f"{top}: call{more}\n"
            f'call: {start} "\\n" call_body "\\n" {literal(fmt.end)}\n' + "".join(rules))


@dataclass(frozen=True)
class Call:
    name: str
    arguments: str  # a JSON object's text


Piece = str | Call


class ToolCallSplitter:
    """Streamed text in, text and calls out. Text between the markers is held until the call's
    end marker, then parsed; a call that does not parse is released as the text it was (markers
    included) and logged, never dropped. A model whose end marker is empty writes its calls
    last: they are parsed at the end. `single`: the first call ends the generation (`done`).
    `check`: the strict tools, whose calls must also validate against their parameters (else
    they are text too)."""

    def __init__(self, fmt: ToolFormat, tools: list[dict[str, Any]], single: bool,
                 rid: str = "", check: ArgsCheck | None = None) -> None:
        self.fmt, self.tools, self.single, self.rid = fmt, tools, single, rid
        self.check = check
        self._held = ""  # text that may be the start of a start marker
        self._call: str | None = None  # text of the call under way
        self._gap = ""  # whitespace after a call: dropped if only calls or nothing follow
        self.made = 0
        self.done = False

    def feed(self, text: str) -> list[Piece]:
        out: list[Piece] = []
        buf, self._held = self._held + text, ""
        start, end = self.fmt.start, self.fmt.end
        while buf and not self.done:
            if self._call is None:
                i = buf.find(start)
                if i < 0:
                    keep = _partial(buf, start)
                    out.append(self._after_call(buf[: len(buf) - keep]))
                    self._held = buf[len(buf) - keep:]
                    break
                out.append(self._after_call(buf[:i]))
                self._gap = ""  # whitespace between two calls
                buf, self._call = buf[i + len(start):], ""
                continue
            self._call += buf
            j = self._call.find(end) if end else -1
            if j < 0:
                break
            body, buf = self._call[:j], self._call[j + len(end):]
            self._call = None
            out += self._parsed(body)
        return _merge(out)

    def _after_call(self, text: str) -> str:
        """Text, held back while it is whitespace following a call."""
        if not self.made:
            return text
        text, self._gap = self._gap + text, ""
        if text.strip():
            return text
        self._gap = text
        return ""

    def flush(self) -> list[Piece]:
        """The generation ended: a call still open is parsed as it is (or returned as text)."""
        out: list[Piece] = [self._after_call(self._held)]
        self._held = ""
        if self._call is not None and not self.done:
            body, self._call = self._call, None
            out += self._parsed(body, closed=False)
        return _merge(out)

    def _parsed(self, body: str, closed: bool = True) -> list[Piece]:
        try:
            parsed = self.fmt.parse(body, self.tools)
            calls = [_call(c) for c in (parsed if isinstance(parsed, list) else [parsed])]
            if not calls:
                raise ValueError("no call in it")
            for c in calls:
                why = self.check.error(c.name, c.arguments) if self.check else None
                if why is not None:
                    raise ValueError(f"the arguments of {clip(c.name, 64)!r}, a strict tool, do "
                                     f"not validate against its parameters: {why}")
        except Exception as e:  # noqa: BLE001 -- each parser raises its own kinds
            log(f"request {self.rid}: a tool call did not parse ({type(e).__name__}: "
                f"{clip(str(e), 200)}); returned as text", WARNING)
            return [self.fmt.start + body + (self.fmt.end if closed else "")]
        self.made += len(calls)
        self.done = self.single
        return list(calls)


def _call(c: Any) -> Call:
    if not isinstance(c, dict) or not isinstance(c.get("name"), str) or not c["name"]:
        raise ValueError("a call without a name")
    args = c.get("arguments", {})
    if isinstance(args, str):
        args = json.loads(args) if args.strip() else {}
    if not isinstance(args, dict):
        raise ValueError("arguments that are not a JSON object")
    return Call(c["name"], json.dumps(args, ensure_ascii=False))


def _partial(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


def _merge(pieces: list[Piece]) -> list[Piece]:
    out: list[Piece] = []
    for p in pieces:
        if isinstance(p, str) and out and isinstance(out[-1], str):
            out[-1] += p
        elif p != "":
            out.append(p)
    return out


def splitter(tokenizer: Any, req: m.Generate,
             check: ArgsCheck | None = None) -> ToolCallSplitter | None:
    """The splitter of a request's output: one when it may call its tools."""
    fmt = ToolFormat.of(tokenizer)
    if fmt is None or not req.tools or req.tool_choice == "none":
        return None
    return ToolCallSplitter(fmt, req.tools, not req.parallel_tool_calls, req.id, check)


def events(rid: str, pieces: list[Piece]) -> list[m.Event]:
    return [m.Text(rid, p) if isinstance(p, str) else m.ToolCall(rid, p.name, p.arguments)
            for p in pieces if p != ""]


def finish_reason(reason: str, calls: ToolCallSplitter | None) -> m.FinishReason:
    """As OpenAI: a generation that ended on its own after a call ends for `tool_calls`."""
    if reason == "length":
        return "length"
    return "tool_calls" if calls is not None and calls.made else "stop"
