"""The runner's answer as every dialect receives it, made once from the runner's events: a
whole answer is one `Reply` (text, reasoning, tool calls, why it stopped, usage, logprobs); a
streamed one is its pieces in order (`Piece`, `Called`, then `Finished`). `Deltas` turns the
events into the pieces, `Whole` joins the pieces into the reply. Each dialect renders these
(exod.api.output, exod.api.dialects); none reads another dialect's shape.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from exod.wire import messages as m
from exod.api.stop_reasons import StopReason

ARGUMENT_PIECE = 64  # characters of a call's arguments per streamed event, in every dialect


@dataclass(frozen=True)
class Usage:
    prompt: int  # the prompt's tokens, `cached` among them
    completion: int  # the generated tokens, `reasoning` among them
    cached: int = 0  # prompt tokens taken from the prompt cache, not prefilled
    reasoning: int = 0  # of `completion`: those of the think block, markers too


@dataclass(frozen=True)
class Call:
    """A tool call: `arguments` is a JSON object's text, as the model's parser found it."""

    id: str
    name: str
    arguments: str

    def pieces(self) -> list[str]:
        """The arguments as a stream carries them, a piece at a time (none when empty)."""
        args = self.arguments
        return [args[i:i + ARGUMENT_PIECE] for i in range(0, len(args), ARGUMENT_PIECE)]


@dataclass(frozen=True)
class Piece:
    """The next piece of text (and of reasoning, apart), with its tokens' logprobs."""

    text: str
    reasoning: str = ""
    logprobs: tuple[m.TokenLogprob, ...] = ()


@dataclass(frozen=True)
class Called:
    """A tool call, whole: `index` counts the answer's calls from 0."""

    index: int
    call: Call


@dataclass(frozen=True)
class Finished:
    """The answer's end: why it stopped (and the stop sequence that matched), what it counted,
    and the request's context edits that changed the prompt (as Anthropic reports them)."""

    stop: StopReason
    usage: Usage
    stop_sequence: str | None = None
    applied_edits: tuple[dict[str, Any], ...] = ()

    @classmethod
    def of(cls, done: m.Done) -> Finished:
        return cls(StopReason.of(done), Usage(done.prompt_tokens, done.completion_tokens,
                                        done.cached_tokens, done.reasoning_tokens),
                   done.stop_sequence, tuple(done.applied_edits))


Delta = Piece | Called | Finished


@dataclass(frozen=True)
class Reply:
    """A whole answer."""

    text: str
    finished: Finished
    reasoning: str = ""
    calls: tuple[Call, ...] = ()
    logprobs: tuple[m.TokenLogprob, ...] = ()

    @property
    def stop(self) -> StopReason:
        return self.finished.stop

    @property
    def usage(self) -> Usage:
        return self.finished.usage


def call_id(ev: m.ToolCall) -> str:
    """The call's id: the runner's where the model's format shapes ids (Mistral's nine
    letters and digits, which its template demands back), else one of OpenAI's shape."""
    return ev.call_id or f"call_{secrets.token_hex(12)}"


class Deltas:
    """The pieces of one answer, from its runner's events (its calls numbered in order)."""

    def __init__(self) -> None:
        self.calls = 0

    def of(self, ev: m.Text | m.ToolCall | m.Done) -> Delta:
        if isinstance(ev, m.Text):
            return Piece(ev.text, ev.reasoning, tuple(ev.logprobs))
        if isinstance(ev, m.ToolCall):
            self.calls += 1
            return Called(self.calls - 1, Call(call_id(ev), ev.name, ev.arguments))
        return Finished.of(ev)


class Whole:
    """One answer's pieces joined: `add` returns the reply once they are all in."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.calls: list[Call] = []
        self.logprobs: list[m.TokenLogprob] = []

    def add(self, d: Delta) -> Reply | None:
        if isinstance(d, Piece):
            self.text.append(d.text)
            self.reasoning.append(d.reasoning)
            self.logprobs += d.logprobs
        elif isinstance(d, Called):
            self.calls.append(d.call)
        else:
            return Reply("".join(self.text), d, "".join(self.reasoning), tuple(self.calls),
                         tuple(self.logprobs))
        return None
