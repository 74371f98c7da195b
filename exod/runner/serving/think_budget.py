"""A thinking budget for a free (unconstrained) request: once the model has written `budget`
tokens of reasoning, the end-of-think marker is the only token it may write, so the block
closes and the answer follows. A constrained request bounds its reasoning in its grammar
instead (exod.runner.serving.think_grammar).

The processor keeps no count of its own: each call reads the tokens generated so far (the
history mlx-lm hands every processor) inside the graph, so nothing waits for a token to be
known on the host, and a speculative draft the model rejects (mlx-lm rewinds the history)
leaves nothing stale behind.
"""

from __future__ import annotations

import mlx.core as mx

from exod.runner.serving.output import Markers


class ThinkBudget:
    """An mlx-lm logits processor. Reasoning counts every token inside any think block (the
    markers excepted), whichever block it is in: the budget is the request's, not a block's.
    `opened`: the prompt ends inside a block (the chat template opened it). The first call
    sees the prompt only (its last token is the prompt's): later calls see what was generated
    after it."""

    def __init__(self, markers: Markers, opened: bool, budget: int) -> None:
        self.start, self.end = markers
        self.opened = opened
        self.budget = budget
        self._prompt: int | None = None  # tokens in the history at the first call

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        history = tokens.reshape(-1)
        if self._prompt is None:
            self._prompt = history.size
        generated = history[self._prompt:]
        if generated.size == 0:
            return logits  # no reasoning yet; a budget is at least 1
        width = logits.shape[-1]
        if not 0 <= self.end < width:
            return logits  # a marker outside the logits: nothing to force
        force = self.over(generated)
        only_end = mx.arange(width) == self.end
        return mx.where(force & ~only_end, mx.array(-mx.inf, dtype=logits.dtype), logits)

    def over(self, generated: mx.array) -> mx.array:
        """True (a scalar in the graph) when the model is inside a think block and has
        written `budget` tokens of reasoning: the next token must end it."""
        at = mx.arange(1, generated.size + 1)
        # Where the latest start and end markers stand after each token (0: the prompt's
        # block, -1: none); inside after a token when the latest marker is a start.
        starts = mx.cummax(mx.where(generated == self.start, at, 0 if self.opened else -1))
        ends = mx.cummax(mx.where(generated == self.end, at, -1))
        inside = starts > ends
        before = mx.concatenate([mx.array([self.opened]), inside[:-1]])
        marker = (generated == self.start) | (generated == self.end)
        reasoning = mx.sum(before & ~marker)
        return inside[-1] & (reasoning >= self.budget)
