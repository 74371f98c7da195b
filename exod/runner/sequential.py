"""The turn-taking engine: each request steps through mlx-lm's `stream_generate` on its own, one
token of each running request per step, with no prompt cache.

Rank 0 of a group serves with it. Its model is parallel.LeaderModel, whose forward carries one
sequence (headers and transfers are shaped (1, length)), and whose other ranks hold one plain
KV cache per request; a batch would need every rank to mirror the batch cache's merge, filter
and extend. Prefill is one step here (one forward through the group), so a stop or a cancel
waits for it: the limitation `exoctl status` reports under `serving.batching`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import mlx.core as mx
from mlx_lm.generate import GenerationResponse, stream_generate

from exod import messages as m
from exod.runner import validate
from exod.runner.generate import (
    bias_processors,
    make_request_sampler,
    prompt_tokens,
    vocab_size,
)
from exod.runner.log import ERR, log
from exod.runner.stops import StopMatcher

WHY_NOT_BATCHED = ("one request at a time: a multi-rank group's forward carries one sequence "
                   "(no continuous batching, prompt cache or chunked prefill yet)")


class Generation:
    def __init__(self, model: Any, tokenizer: Any, req: m.Generate) -> None:
        self.id = req.id
        prompt = prompt_tokens(tokenizer, req)
        processors = bias_processors(req.logit_bias, vocab_size(model, tokenizer))
        self._responses: Iterator[GenerationResponse] = stream_generate(
            model, tokenizer, mx.array(prompt), max_tokens=validate.max_tokens(req.max_tokens),
            sampler=make_request_sampler(req), logits_processors=processors or None)
        self._stops = StopMatcher(req.stop)
        self.prompt_tokens = len(prompt)
        self.completion_tokens = 0
        self.started = False  # its first step (the whole prefill) has run

    def step(self) -> tuple[str, m.FinishReason | None]:
        """Generate one token: (text to release now, finish reason or None while going on)."""
        r = next(self._responses)
        self.started = True
        self.completion_tokens = r.generation_tokens
        text = self._stops.feed(r.text)
        if self._stops.stopped:
            self.close()
            return text, "stop"
        if r.finish_reason is not None:
            return text + self._stops.flush(), "length" if r.finish_reason == "length" else "stop"
        return text, None

    def close(self) -> None:
        close = getattr(self._responses, "close", None)
        if close is not None:
            close()

    def done(self, finish_reason: m.FinishReason) -> m.Done:
        return m.Done(self.id, finish_reason, self.prompt_tokens, self.completion_tokens)


class TurnEngine:
    """Generations take turns, one token each per step (see exod.runner.serve.Engine)."""

    def __init__(self, model: Any, tokenizer: Any, width: int) -> None:
        self.model, self.tokenizer, self.width = model, tokenizer, width
        self.gens: dict[str, Generation] = {}

    @property
    def active(self) -> int:
        return len(self.gens)

    def admit(self, req: m.Generate) -> None:
        self.gens[req.id] = Generation(self.model, self.tokenizer, req)

    def cancel(self, rid: str) -> None:
        gen = self.gens.pop(rid, None)
        if gen is not None:
            gen.close()

    def step(self) -> list[m.Event]:
        out: list[m.Event] = []
        for rid, gen in list(self.gens.items()):
            try:
                text, reason = gen.step()
            except Exception as e:  # noqa: BLE001 -- mlx raises many types: fail this one, go on
                log(f"generation {rid} failed: {type(e).__name__}: {e}", ERR)
                self.cancel(rid)
                out.append(m.Error(rid, "internal", f"{type(e).__name__}: {e}"))
                continue
            if text:
                out.append(m.Text(rid, text))
            if reason is not None:
                del self.gens[rid]
                out.append(gen.done(reason))
        return out

    def abort_all(self, code: m.ErrorCode, message: str) -> list[m.Event]:
        out: list[m.Event] = []
        for rid in list(self.gens):
            self.cancel(rid)
            out.append(m.Error(rid, code, message))
        return out

    def abort_prefilling(self, code: m.ErrorCode, message: str) -> list[m.Event]:
        out: list[m.Event] = []
        for rid, gen in list(self.gens.items()):
            if not gen.started:
                self.cancel(rid)
                out.append(m.Error(rid, code, message))
        return out

    def serving(self) -> m.Serving:
        return m.Serving(batching=WHY_NOT_BATCHED, width=self.width, active=self.active)
