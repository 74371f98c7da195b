"""Reasoning before a constrained answer (exod.runner.serving.grammar), for a model with think
markers (single tokens, or several whose end starts with a special token: Gemma 4's, harmony's
analysis channel): the Lark rules (llguidance's dialect) that put a bounded think block
before the answer's own rules. Pure: no mlx, no engine; unit-tested on its own.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Thinking:
    """Reasoning before a constrained answer, for a model with think markers. The grammar lets
    the model think (any text but the markers), then makes it write the end marker (what
    exod.runner.serving.output, or the text splitter, cuts on), then the answer: the
    JSON lands in `content`, never in the reasoning. `opened`: the chat template opened the
    block (the prompt ends inside it); else the model may open one first or answer at once.
    `budget` bounds the reasoning in tokens, so that a model that would think forever (a random
    one does) is made to close the block and answer within the request's max_tokens."""

    start: int | str  # a marker token's id, or a marker as Lark (several tokens, a channel)
    end: int | str
    opened: bool
    budget: int

    @classmethod
    def of(cls, markers: tuple[int, int] | tuple[str, str] | None, opened: bool, enabled: bool,
           max_tokens: int, budget: int | None = None) -> Thinking | None:
        """The thinking allowed before a constrained answer: None when the model has no
        markers, or its block is not opened and thinking is off (enable_thinking false).
        `budget` (the request's think_budget) bounds the reasoning; without one, half of
        max_tokens at most goes to it: the answer keeps the other half."""
        if markers is None or not (opened or enabled):
            return None
        return cls(markers[0], markers[1], opened,
                   budget if budget is not None else max(1, max_tokens // 2))

    def before(self, answer: str) -> str:
        """A Lark grammar: the reasoning, then `answer` (rules defining `answer`)."""
        start, end = (f"<[{m}]>" if isinstance(m, int) else m for m in (self.start, self.end))
        head = f"thought {end} answer" if self.opened else f"({start} thought {end})? answer"
        # A lexeme of any text with a token bound (llguidance's max_tokens). The end marker
        # starts with a special token for the engine (the caller checks), never text: the
        # reasoning cannot hold one, and only the marker itself ends it.
        return (f"start: {head}\n"
                f"thought[max_tokens={self.budget}]: /(.|\\n)*/\n"
                f"{answer}")
