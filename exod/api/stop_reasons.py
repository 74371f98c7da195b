"""Why an answer stopped, once (`StopReason`), and how each dialect words it: one table, read by
every dialect's rendering (exod.api.dialects). The runner says "stop", "length" or
"tool_calls" (exod.wire.messages.Done), and the stop sequence it matched; Anthropic alone tells
a stop sequence from the model's own end, so the two are apart here."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from exod.wire import messages as m


class StopReason(enum.Enum):
    END = "end"  # the model ended its turn (an end token)
    STOP_SEQUENCE = "stop_sequence"  # one of the request's stop sequences matched
    LENGTH = "length"  # max_tokens (or the context window) cut it short
    TOOL_CALLS = "tool_calls"  # the turn ended with tool calls

    @classmethod
    def of(cls, done: m.Done) -> StopReason:
        if done.finish_reason == "length":
            return cls.LENGTH
        if done.finish_reason == "tool_calls":
            return cls.TOOL_CALLS
        return cls.END if done.stop_sequence is None else cls.STOP_SEQUENCE


@dataclass(frozen=True)
class Wording:
    """One stop reason in each dialect's words."""

    openai: str  # chat completions' and completions' `finish_reason`
    anthropic: str  # Messages' `stop_reason`
    responses: str  # Responses' `status`
    incomplete: str | None  # Responses' `incomplete_details.reason`, when `incomplete`
    ollama: str  # `done_reason` (a tool call ends a turn as a stop does: Ollama has no other)


STOP_REASONS: dict[StopReason, Wording] = {
    StopReason.END: Wording("stop", "end_turn", "completed", None, "stop"),
    StopReason.STOP_SEQUENCE: Wording("stop", "stop_sequence", "completed", None, "stop"),
    StopReason.LENGTH: Wording("length", "max_tokens", "incomplete", "max_output_tokens", "length"),
    StopReason.TOOL_CALLS: Wording("tool_calls", "tool_use", "completed", None, "stop"),
}


def wording(stop: StopReason | None) -> Wording:
    """A stop reason's words; None (a stream that ended without one) reads as the model's end."""
    return STOP_REASONS[stop or StopReason.END]
