"""Tool calls in a model's output, in the model's own format (exod.runner.formats: found as
mlx-lm's tokenizer wrapper infers it from the chat template, or harmony's by its tokens): what a
request may ask of the model's format, the splitter that cuts calls and reasoning out of a
generation's text, and the finish reason a generation that called ends with. The engines use
these; the formats themselves are pure and unit-tested on their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from exod.wire import messages as m
from exod.core.request_rules import RequestError
from exod.runner import formats
from exod.runner.formats import Piece, Splitter, ToolFormat
from exod.runner.serving.strict_args import ArgsCheck

__all__ = ["Piece", "Splitter", "check", "events", "finish_reason", "splitter"]


def check(fmt: ToolFormat | None, req: m.Generate) -> None:
    """A request's tools against the model: RequestError naming the field it cannot take."""
    if req.tools and fmt is None:
        raise RequestError("`tools`: this model's chat template has no tool support (exod "
                           "finds no tool-call format in it)", "tools")
    if req.tool_choice in ("required", "function") and fmt is not None and not fmt.forceable:
        raise RequestError(f"`tool_choice`: this model writes tool calls as {fmt.kind}, which "
                           "exod cannot force; use \"auto\"", "tool_choice")


def splitter(tokenizer: Any, req: m.Generate, check: ArgsCheck | None = None,
             prompt: Sequence[int] = ()) -> Splitter | None:
    """The splitter of a request's output: calls when it may call its tools, and reasoning
    the model marks in its text (`prompt`: its tokens, whose end may open a think block)."""
    return formats.splitter(tokenizer, req, check, prompt)


def events(rid: str, pieces: list[Piece]) -> list[m.Event]:
    return formats.events(rid, pieces)


def finish_reason(reason: str, calls: Splitter | None) -> m.FinishReason:
    """As OpenAI: a generation that ended on its own after a call ends for `tool_calls`."""
    if reason == "length":
        return "length"
    return "tool_calls" if calls is not None and calls.made else "stop"
