"""One generation request in the runner: prompt (chat template or raw text), sampling, stop
sequences, usage counts, advanced one token at a time by the serve loop.

Stepping one token at a time is what lets the serve loop cancel a generation within one token,
end it at the drain deadline, and interleave several requests when the daemon allows it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import mlx.core as mx
from mlx_lm.generate import GenerationResponse, stream_generate
from mlx_lm.sample_utils import make_sampler

from exod.protocol import Message
from exod.runner import validate
from exod.runner.load import Loaded
from exod.runner.stops import StopMatcher
from exod.runner.validate import RequestError

__all__ = ["Generation", "RequestError", "chat_prompt"]


def chat_prompt(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    if getattr(tokenizer, "has_chat_template", True):
        tokens = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        return [int(t) for t in tokens]
    # No template in the model: plain "role: content" lines, then the assistant's turn.
    text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
    return list(tokenizer.encode(text))


class Generation:
    def __init__(self, loaded: Loaded, req: Message) -> None:
        self.id = str(req["id"])
        tok = loaded.tokenizer
        if req.get("kind") == "chat":
            prompt: Any = mx.array(chat_prompt(tok, req["messages"]))
        else:
            prompt = str(req.get("prompt", ""))  # stream_generate adds BOS as the model wants
        if (isinstance(prompt, str) and not prompt) or (not isinstance(prompt, str)
                                                        and prompt.size == 0):
            raise RequestError("the prompt is empty")
        if req.get("seed") is not None:
            mx.random.seed(int(req["seed"]) % (1 << 64))
        sampler = make_sampler(temp=validate.unit_number(req.get("temperature"), "temperature",
                                                         1.0, 2.0),
                               top_p=validate.unit_number(req.get("top_p"), "top_p", 1.0, 1.0))
        bias = validate.logit_bias(req.get("logit_bias"))
        vocab = _vocab(loaded.model)
        if vocab is not None:
            validate.check_ids(list(bias), vocab)
        processors = [validate.bias_processor(bias)] if bias else None
        self._responses: Iterator[GenerationResponse] = stream_generate(
            loaded.model, tok, prompt, max_tokens=validate.max_tokens(req.get("max_tokens")),
            sampler=sampler, logits_processors=processors)
        self._stops = StopMatcher(list(req.get("stop") or []))
        self.prompt_tokens = 0
        self.completion_tokens = 0

    def step(self) -> tuple[str, str | None]:
        """Generate one token: (text to release now, finish reason or None while going on)."""
        r = next(self._responses)
        self.prompt_tokens, self.completion_tokens = r.prompt_tokens, r.generation_tokens
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


def _vocab(model: Any) -> int | None:
    """The model's vocabulary size as it declares it (the bias processor also checks the real
    width of the logits at the first step)."""
    vocab = getattr(model, "vocab", None) or getattr(getattr(model, "args", None),
                                                      "vocab_size", None)
    return vocab if isinstance(vocab, int) and vocab > 0 else None
