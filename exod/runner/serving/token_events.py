"""What one generated token of a request shows, in the engines that batch
(exod.runner.serving.batch_engine on mlx-lm, exod.runner.vision.engine on mlx-vlm): its text,
reasoning and logprobs (exod.runner.serving.output), then its tool calls; whether it ends the
request before the generator would (a stop sequence, or the one call a request wanted), and the
request's `Done` once it has ended.
"""

from __future__ import annotations

from dataclasses import dataclass

from exod.wire import messages as m
from exod.runner.serving import tool_calls
from exod.runner.serving.output import Output, with_pieces


@dataclass(frozen=True)
class Shown:
    events: list[m.Event]
    reason: str | None  # why the request ended with this token; None: it goes on
    early: bool  # it ended here, the generator not: the engine takes it out of the batch


def show_token(rid: str, out: Output, calls: tool_calls.Splitter | None, token: int,
               entry: m.TokenLogprob | None, finish_reason: str | None,
               completion_tokens: int) -> Shown:
    """`finish_reason`: the generator's for this token ("stop" on an end token, "length")."""
    reason = finish_reason
    # An end-of-sequence token is never shown (as stream_generate).
    piece = out.add(token, entry, eos=reason == "stop", last=reason is not None)
    pieces: list[tool_calls.Piece] = calls.feed(piece.text) if calls else [piece.text]
    if calls is not None and calls.thinking and reason != "stop":
        out.reasoning_tokens += 1  # reasoning found in the text (its markers: exod.runner.formats)
    early = False
    if out.stopped or (calls and calls.done):
        early, reason = reason is None, "stop"
    if reason is not None:
        pieces += calls.flush(cut=reason == "length") if calls else []
    events = with_pieces(rid, piece, tool_calls.events(rid, pieces))
    if not events and reason is None:  # a token all the same: progress for the hang watch
        events.append(m.Held(rid, completion_tokens))
    return Shown(events, reason, early)


def done(rid: str, reason: str, out: Output, calls: tool_calls.Splitter | None,
         prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> m.Done:
    return m.Done(rid, tool_calls.finish_reason(reason, calls), prompt_tokens,
                  completion_tokens, out.stops.matched, cached_tokens, out.reasoning_tokens)
