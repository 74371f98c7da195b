"""What one generation shows, token by token: its text through the streaming detokenizer and
its stop sequences, its thinking apart from its answer, and its tokens' logprobs alongside the
text they make. Pure Python (no mlx): both engines feed it, and it is unit-tested on its own.

Thinking: a model whose tokenizer has single-token think markers (mlx-lm's TokenizerWrapper
finds `<think>`/`</think>` and the like) writes its reasoning between them. The markers are
never shown; the text between them goes to `reasoning`, and stop sequences apply to the answer
only. A prompt that ends inside a think block (the chat template opened it) starts there.

Logprobs: one entry per token of the answer (not the markers, the reasoning or the end-of-
sequence token), sent with the text that token starts in. Text held back (an incomplete
character, a possible stop sequence) holds its tokens' entries back too; the tokens of a stop
sequence are never sent, as their text never is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from exod.wire import messages as m
from exod.runner.serving.stop_sequences import StopMatcher


@dataclass
class Released:
    """What a token released: text, reasoning, and the logprobs of the text's tokens."""

    text: str = ""
    reasoning: str = ""
    logprobs: list[m.TokenLogprob] = field(default_factory=list)

    def event(self, rid: str) -> m.Text | None:
        if not (self.text or self.reasoning or self.logprobs):
            return None
        return m.Text(rid, self.text, self.reasoning, self.logprobs)


Markers = tuple[int, int]  # think start and end token ids


def think_markers(tokenizer: Any) -> Markers | None:
    """The tokenizer's think markers when each is one token (mlx-lm's wrapper knows them);
    None for a model without them (or with markers of several tokens: its thinking stays in
    the text)."""
    if not getattr(tokenizer, "has_thinking", False):
        return None
    try:
        start, end = tokenizer.think_start_id, tokenizer.think_end_id
    except ValueError:  # several tokens each
        return None
    return (int(start), int(end)) if start is not None and end is not None else None


def opens_thinking(prompt: list[int], markers: Markers | None) -> bool:
    """True when the prompt ends inside a think block (its last start after its last end)."""
    if markers is None:
        return False
    backwards = prompt[::-1]  # list methods: C speed over a prompt of millions of tokens
    start, end = (backwards.index(t) if t in backwards else len(prompt) for t in markers)
    return start < end


class Output:
    def __init__(self, detokenizer: Any, stops: list[str], markers: Markers | None = None,
                 thinking: bool = False) -> None:
        self.detok = detokenizer
        self.stops = StopMatcher(stops)
        self.markers = markers
        self.thinking = thinking
        self._pending: list[tuple[int, m.TokenLogprob]] = []  # (where its text starts, entry)
        self._fed = 0  # characters of answer given to the stop matcher
        self._released = 0  # ... and released by it
        self.reasoning_tokens = 0  # tokens of think blocks, their markers included

    @property
    def stopped(self) -> bool:
        """A stop sequence came: the generation ends here."""
        return self.stops.stopped

    def add(self, token: int, entry: m.TokenLogprob | None = None, *, eos: bool = False,
            last: bool = False) -> Released:
        """A generated token (`eos`: the end-of-sequence token, never shown; `last`: the
        generation ends with it) and its logprob entry when asked for."""
        piece = Released()
        if self.stops.stopped:
            return piece
        was_thinking = self.thinking
        if self.markers is not None and token in self.markers and not eos:
            self.detok.finalize()  # what came before the marker belongs before it
            self._route(self.detok.last_segment, piece)
            self.thinking = token == self.markers[0]
        elif not eos:
            self.detok.add_token(token)
            if entry is not None and not self.thinking:
                self._pending.append((self._fed, entry))
        if (was_thinking or self.thinking) and not eos:  # the opening and closing marker count
            self.reasoning_tokens += 1
        if last:
            self.detok.finalize()
        self._route(self.detok.last_segment, piece)
        if last and not self.stops.stopped:
            rest = self.stops.flush()
            piece.text += rest
            self._released += len(rest)
        piece.logprobs = self._release(everything=last and not self.stops.stopped)
        return piece

    def _route(self, segment: str, piece: Released) -> None:
        if not segment:
            return
        if self.thinking:
            piece.reasoning += segment
            return
        self._fed += len(segment)
        shown = self.stops.feed(segment)
        self._released += len(shown)
        piece.text += shown

    def _release(self, everything: bool) -> list[m.TokenLogprob]:
        """The entries whose text has been released (all of them when the generation ended
        without a stop sequence); a stop drops the rest."""
        n = len(self._pending) if everything else next(
            (i for i, (at, _) in enumerate(self._pending) if at >= self._released),
            len(self._pending))
        out = [entry for _, entry in self._pending[:n]]
        self._pending = [] if self.stops.stopped else self._pending[n:]
        return out


def with_pieces(rid: str, piece: Released, shown: list[m.Event]) -> list[m.Event]:
    """The events of a token: `shown`, its answer's text after the tool-call splitter (text
    and calls), with the token's reasoning and logprobs on the first text (or on one of their
    own before the rest)."""
    if not (piece.reasoning or piece.logprobs):
        return shown
    first = next((i for i, e in enumerate(shown) if isinstance(e, m.Text)), None)
    if first is None:
        return [m.Text(rid, "", piece.reasoning, piece.logprobs), *shown]
    text = shown[first]
    assert isinstance(text, m.Text)
    return [*shown[:first], m.Text(rid, text.text, piece.reasoning, piece.logprobs),
            *shown[first + 1:]]
