"""The turn-taking engine: each generation advances one token at a time, in turn.

A generation is a prompt (chat template or raw text), sampling, stop sequences and usage
counts. Stepping one token at a time is what lets the serve loop cancel a generation within
one token, end it at the drain deadline, and interleave several requests when the daemon
allows it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import mlx.core as mx
from mlx_lm.generate import GenerationResponse, stream_generate
from mlx_lm.sample_utils import make_logits_processors, make_sampler

from exod import messages as m
from exod.runner.load import Loaded
from exod.runner.log import ERR, log
from exod.runner.serve import RequestError
from exod.runner.stops import StopMatcher


def chat_prompt(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    if getattr(tokenizer, "has_chat_template", True):
        tokens = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        return [int(t) for t in tokens]
    # No template in the model: plain "role: content" lines, then the assistant's turn.
    text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
    return list(tokenizer.encode(text))


class Generation:
    def __init__(self, loaded: Loaded, req: m.Generate) -> None:
        self.id = req.id
        tok = loaded.tokenizer
        if req.kind == "chat":
            prompt: Any = mx.array(chat_prompt(tok, req.messages or []))
        else:
            prompt = req.prompt or ""  # stream_generate adds BOS as the model wants
        if (isinstance(prompt, str) and not prompt) or (not isinstance(prompt, str)
                                                        and prompt.size == 0):
            raise RequestError("the prompt is empty")
        if req.seed is not None:
            mx.random.seed(req.seed % (1 << 64))
        sampler = make_sampler(temp=req.temperature, top_p=req.top_p)
        bias = req.logit_bias
        processors = (make_logits_processors(logit_bias={int(k): v for k, v in bias.items()})
                      if bias else None)
        self._responses: Iterator[GenerationResponse] = stream_generate(
            loaded.model, tok, prompt, max_tokens=req.max_tokens, sampler=sampler,
            logits_processors=processors)
        self._stops = StopMatcher(req.stop)
        self.prompt_tokens = 0
        self.completion_tokens = 0

    def step(self) -> tuple[str, m.FinishReason | None]:
        """Generate one token: (text to release now, finish reason or None while going on)."""
        r = next(self._responses)
        self.prompt_tokens, self.completion_tokens = r.prompt_tokens, r.generation_tokens
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

    def __init__(self, loaded: Loaded) -> None:
        self.loaded = loaded
        self.gens: dict[str, Generation] = {}

    @property
    def active(self) -> int:
        return len(self.gens)

    def admit(self, req: m.Generate) -> None:
        self.gens[req.id] = Generation(self.loaded, req)

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
