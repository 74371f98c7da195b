"""The per-request engine: each request steps through mlx-lm's `stream_generate` on its own, one
token of each running request per step, with no prompt cache.

Rank 0 of a group serves with it. Its model is parallel.LeaderModel, whose forward carries one
sequence (headers and transfers are shaped (1, length)), and whose other ranks hold one plain
KV cache per request; a batch would need every rank to mirror the batch cache's merge, filter
and extend. Prefill is one step here (one forward through the group), so a stop or cancel
waits for it: the limitation `exoctl status` reports as `batching`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import mlx.core as mx
from mlx_lm.generate import GenerationResponse, stream_generate

from exod.protocol import Message
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
    def __init__(self, model: Any, tokenizer: Any, req: Message) -> None:
        self.id = str(req["id"])
        prompt = prompt_tokens(tokenizer, req)
        processors = bias_processors(req.get("logit_bias"), vocab_size(model, tokenizer))
        self._responses: Iterator[GenerationResponse] = stream_generate(
            model, tokenizer, mx.array(prompt), max_tokens=int(req["max_tokens"]),
            sampler=make_request_sampler(req), logits_processors=processors or None)
        self._stops = StopMatcher(list(req.get("stop") or []))
        self.prompt_tokens = len(prompt)
        self.completion_tokens = 0

    def step(self) -> tuple[str, str | None]:
        """Generate one token: (text to release now, finish reason or None while going on)."""
        r = next(self._responses)
        self.completion_tokens = r.generation_tokens
        text = self._stops.feed(r.text)
        if self._stops.stopped:
            self.close()
            return text, "stop"
        if r.finish_reason is not None:
            return text + self._stops.flush(), r.finish_reason
        return text, None

    def close(self) -> None:
        close = getattr(self._responses, "close", None)
        if close is not None:
            close()

    def done(self, finish_reason: str) -> Message:
        return {"id": self.id, "ev": "done", "finish_reason": finish_reason,
                "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens}


class SequentialEngine:
    """The engine interface of exod.runner.engine.BatchEngine over per-request generations."""

    batched = False

    def __init__(self, model: Any, tokenizer: Any, width: int) -> None:
        self.model, self.tokenizer, self.width = model, tokenizer, width
        self._active: dict[str, Generation] = {}

    @property
    def busy(self) -> bool:
        return bool(self._active)

    @property
    def active(self) -> int:
        return len(self._active)

    def admit(self, req: Message) -> None:
        gen = Generation(self.model, self.tokenizer, req)
        self._active[gen.id] = gen

    def cancel(self, rid: str) -> None:
        gen = self._active.pop(rid, None)
        if gen is not None:
            gen.close()

    def step(self) -> list[Message]:
        events: list[Message] = []
        for rid, gen in list(self._active.items()):
            try:
                text, reason = gen.step()
            except Exception as e:  # noqa: BLE001 -- mlx raises many types: fail this one, go on
                log(f"generation {rid} failed: {type(e).__name__}: {e}", ERR)
                self.cancel(rid)
                events.append({"id": rid, "ev": "error", "code": "internal",
                               "message": f"{type(e).__name__}: {e}"})
                continue
            if text:
                events.append({"id": rid, "ev": "text", "text": text})
            if reason is not None:
                self._active.pop(rid, None)
                events.append(gen.done(reason))
        return events

    def abort_all(self, code: str, message: str) -> list[Message]:
        events = [{"id": rid, "ev": "error", "code": code, "message": message}
                  for rid in self._active]
        for rid in list(self._active):
            self.cancel(rid)
        return events

    def stats(self) -> dict[str, Any]:
        return {"batching": WHY_NOT_BATCHED, "width": self.width, "active": self.active}
