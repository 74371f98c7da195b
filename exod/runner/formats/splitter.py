"""A generation's text, streamed, cut into its parts by the model's markers (a format's table,
exod.runner.formats.base): the answer, reasoning whose markers are several tokens (Gemma 4's
`<|channel>thought` ... `<channel|>`, harmony's analysis channel), and tool calls, parsed by the
format once each ends. No markup of the format ever reaches the answer: text that may be the
start of a marker is held until it is one or cannot be, and a call that does not parse (cut by
max_tokens, malformed, or a strict tool's arguments that do not validate) is logged and
dropped, never shown as text. Pure: the format is handed in; unit-tested on its own.
"""

from __future__ import annotations

from exod.core.text import clip
from exod.runner.formats.base import Piece, Thought, ToolFormat, Transitions
from exod.runner.link.log import WARNING, log
from exod.runner.serving.strict_args import ArgsCheck

SHOWN, THINKING, CALLING = "normal", "reasoning", "tool"


def calling(state: str) -> bool:
    """A state that gathers a call's text: `tool`, or a variant of it (`tool_bare`)."""
    return state == CALLING or state.startswith(CALLING + "_")


class Splitter:
    """Text in, pieces out (str: answer; Thought; ParsedCall). `fmt`: the model's call format (None:
    a model that only thinks by text markers). `tools`: the request's (None: calls are not
    parsed, and a format whose calls sit in its table, as harmony's do, has them dropped).
    `most`: calls after which the generation is done. `check`: the strict tools, whose calls
    must validate against their parameters."""

    def __init__(self, initial: str, table: Transitions, fmt: ToolFormat | None,
                 tools: list[dict] | None, most: int, rid: str = "",
                 check: ArgsCheck | None = None) -> None:
        self.state, self.table = initial, table
        self.fmt, self.tools, self.most, self.rid, self.check = fmt, tools, most, rid, check
        self._held = ""  # text that may be the start of a marker
        self._body = ""  # the text of the call under way
        self._gap = ""  # whitespace after a call: dropped if only calls or nothing follow
        self.made = 0
        self.dropped = 0
        self.done = False

    @property
    def thinking(self) -> bool:
        """The text now goes to no answer and no call (reasoning, or a header)."""
        return self.state != SHOWN and not calling(self.state)

    def feed(self, text: str) -> list[Piece]:
        out: list[Piece] = []
        buf, self._held = self._held + text, ""
        while buf and not self.done:
            edges = self.table.get(self.state, ())
            hit, cut = _first(buf, edges), _partial(buf, edges)
            if hit is not None and (cut is None or hit[0] <= cut):
                at, marker, after = hit
                self._emit(buf[:at], out)
                buf = buf[at + len(marker):]
                self._move(marker, after, out)
                continue
            keep = len(buf) if cut is None else cut
            self._emit(buf[:keep], out)
            self._held = buf[keep:]
            break
        return _merge(out)

    def flush(self, cut: bool = False) -> list[Piece]:
        """The generation ended: held text is what it was, and a call under way is parsed as it
        is (a format whose calls end the turn has no end marker, or an end-of-sequence token
        for one). `cut`: max_tokens ended it: a call under way is unfinished, and dropped
        whole, with any written before it in the same block (never arguments cut short)."""
        out: list[Piece] = []
        if not self.done:
            self._emit(self._held, out)
            if calling(self.state) and cut:
                self._body, body = "", self._body
                out += self._drop(body, "max_tokens ended the generation inside it")
            elif calling(self.state):
                out += self._calls(ended=False)
        self._held = ""
        return _merge(out)  # whitespace after the last call (self._gap) is no answer

    def _emit(self, text: str, out: list[Piece]) -> None:
        if not text:
            return
        if self.state == SHOWN:
            out.append(self._after_call(text))
        elif self.state == THINKING:
            out.append(Thought(text))
        elif calling(self.state):
            self._body += text
        # any other state is a header: never shown

    def _move(self, marker: str, after: str, out: list[Piece]) -> None:
        # A marker the format keeps is part of the call's text (a call written without its
        # block: Qwen3-Coder's bare `<function=...>...</function>`).
        kept = self.fmt is not None and marker in self.fmt.kept
        if calling(self.state):
            self._body += marker if kept else ""
            out += self._calls(ended=True)
        elif calling(after):
            self._gap = ""  # whitespace between two calls
        self._body = marker if kept and calling(after) else ""
        self.state = after

    def _after_call(self, text: str) -> str:
        """Text, held back while it is whitespace following a call."""
        if not self.made:
            return text
        text, self._gap = self._gap + text, ""
        if text.strip():
            return text
        self._gap = text
        return ""

    def _calls(self, ended: bool) -> list[Piece]:
        body, self._body = self._body, ""
        if self.fmt is None or self.tools is None:
            return self._drop(body, "the request has no tools to call")
        try:
            calls = self.fmt.parse(body, self.tools)
            for c in calls:
                why = self.check.error(c.name, c.arguments) if self.check else None
                if why is not None:
                    raise ValueError(f"the arguments of {clip(c.name, 64)!r}, a strict tool, "
                                     f"do not validate against its parameters: {why}")
        except Exception as e:  # noqa: BLE001 -- each parser raises its own kinds
            how = "" if ended else " (the generation ended inside it)"
            return self._drop(body, f"it does not parse{how}: {type(e).__name__}: "
                                    f"{clip(str(e), 200, flat=True)}")
        calls = calls[: self.most - self.made]
        self.made += len(calls)
        self.done = self.made >= self.most
        return list(calls)

    def _drop(self, body: str, why: str) -> list[Piece]:
        self.dropped += 1
        log(f"request {self.rid}: a tool call was dropped, {why}: "
            f"{clip(body, 200, flat=True)!r}", WARNING)
        return []


def _first(buf: str, edges: list[tuple[str, str]] | tuple[()]) -> tuple[int, str, str] | None:
    """The earliest marker in `buf` (the longest of those that start there)."""
    best: tuple[int, str, str] | None = None
    for marker, after in edges:
        at = buf.find(marker) if marker else -1
        if at >= 0 and (best is None or at < best[0]
                        or (at == best[0] and len(marker) > len(best[1]))):
            best = (at, marker, after)
    return best


def _partial(buf: str, edges: list[tuple[str, str]] | tuple[()]) -> int | None:
    """Where the longest end of `buf` that is a proper prefix of a marker starts."""
    best = 0
    for marker, _ in edges:
        for n in range(min(len(marker) - 1, len(buf)), best, -1):
            if buf.endswith(marker[:n]):
                best = n
                break
    return len(buf) - best if best else None


def _merge(pieces: list[Piece]) -> list[Piece]:
    out: list[Piece] = []
    for p in pieces:
        if isinstance(p, str) and out and isinstance(out[-1], str):
            out[-1] += p
        elif isinstance(p, Thought) and out and isinstance(out[-1], Thought):
            out[-1] = Thought(out[-1].text + p.text)
        elif p != "" and p != Thought(""):
            out.append(p)
    return out
