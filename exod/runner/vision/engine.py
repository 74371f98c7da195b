"""The serving engine of a model that sees: requests with and without pictures batched together
in mlx-vlm's `BatchGenerator`, behind the serve loop's Engine interface
(exod.runner.serving.loop), as the text runner's BatchEngine is.

A request's life, one bounded unit of work per `step()`, so a cancel or a stop is seen between
any two of them:

- read (the reader's thread, exod.runner.vision.prompt): pictures decoded and checked, the chat
  template, the processor, the request rules;
- admitted: it waits for its turn to be *seen*;
- seen (one step, one request at a time): `get_input_embeddings`, the vision tower (or its
  cached output, exod.runner.vision.features) and the merge of its features into the prompt's
  embeddings, evaluated there; then inserted into the generator with those embeddings and only
  the features the language model reads (mlx-vlm's own `attention_mask_4d`, pixel masks and
  sizes would break a batch of prompts of several lengths: docs/design/vision.md);
- prefilled and decoded by the generator: each step is one `next()`, one decode step for the
  batch plus at most one chunk of prompts (`prefill_step` tokens).

Sampling is per request although mlx-vlm's generator has one sampler: it samples greedily, and
a request with a temperature draws its token with its own sampler (seed, top-p...) in its last
logits processor, which leaves only that token possible. What a request shows (text, reasoning,
stop sequences, tool calls) comes from exod.runner.serving.output as for text.

Not yet: a prompt cache (each turn prefills its whole prompt; its pictures' tower output comes
from the feature cache), logprobs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import mlx.core as mx

from exod import messages as m
from exod.config.schema import GrammarLimits
from exod.core.request_rules import RequestError
from exod.runner.log import ERR, log
from exod.runner.serving.loop import NoPromptCache
from exod.runner.serving import model_checks, tool_calls
from exod.runner.serving.grammar import Grammars
from exod.runner.serving.output import Output
from exod.runner.serving.prepare import Checked, Processor, Sampler, check_request
from exod.runner.serving.reading import Prompt
from exod.runner.serving.token_events import done, show_token
from exod.runner.vision.features import FeatureCache
from exod.runner.vision.prompt import Seen, read_seen

MIN_CHUNK = 32  # as exod.runner.serving.batch_engine
PREFILL_BATCH = 8
# What get_input_embeddings returns that the language model does not read, and that cannot be
# stacked over prompts of several lengths (Gemma 3's 4-D mask).
NOT_FOR_THE_LANGUAGE_MODEL = ("attention_mask_4d",)


@dataclass
class _Request:
    rid: str
    seen: Seen
    checked: Checked
    processors: list[Processor]
    out: Output
    calls: tool_calls.ToolCallSplitter | None
    uid: int = -1  # in the generator, once seen
    completion_tokens: int = 0
    prefilling: bool = True
    prefilled: int = 0

    @property
    def prompt_tokens(self) -> int:
        return len(self.seen.tokens)


class VisionEngine(NoPromptCache):
    def __init__(self, model: Any, processor: Any, tokenizer: Any, *, width: int,
                 prefill_step: int = 256, grammar_limits: GrammarLimits | None = None,
                 feature_bytes: int = 256 << 20,
                 on_new_generator: Callable[[], None] | None = None) -> None:
        """`tokenizer`: mlx-lm's wrapper of the model's tokenizer (detokenizer, end tokens,
        tool-call and think markers, as the text runner has them). `on_new_generator`: called
        after each generator is made (it sets Metal's wired limit as it is made; the instance's
        own setting goes back on after it, as in exod.runner.serving.batch_engine)."""
        self._on_new_generator = on_new_generator
        self.model, self.processor, self.tokenizer = model, processor, tokenizer
        self.width = max(1, width)
        self.prefill_step = max(MIN_CHUNK, prefill_step)
        text_args = SimpleNamespace(args=model.config.text_config)
        self.vocab = model_checks.model_vocab(text_args) or len(tokenizer)
        self.window = model_checks.context_window(text_args)
        self.grammars = Grammars(tokenizer, self.vocab, grammar_limits or GrammarLimits())
        self.features = FeatureCache(model, feature_bytes)
        self._waiting: dict[str, _Request] = {}  # admitted, not seen yet: in arrival order
        self._by_uid: dict[int, _Request] = {}
        self._by_rid: dict[str, _Request] = {}
        self._gen = self._new_generator()
        self.prompt_tokens = 0

    def _new_generator(self) -> Any:
        from mlx_vlm.generate import BatchGenerator

        gen = BatchGenerator(
            self.model.language_model, self.processor,
            stop_tokens={int(t) for t in self.tokenizer.eos_token_ids},
            completion_batch_size=self.width,
            prefill_batch_size=min(self.width, PREFILL_BATCH),
            prefill_step_size=self.prefill_step)
        if self._on_new_generator is not None:
            self._on_new_generator()
        return gen

    # ---- the interface the serve loop uses ------------------------------------------------
    @property
    def active(self) -> int:
        return len(self._waiting) + len(self._by_rid)

    def read(self, req: m.Generate) -> Prompt:
        return read_seen(self.processor, self.model.config, self.tokenizer, req, self.vocab,
                         self.window, self.grammars)

    def admit(self, req: m.Generate, prompt: Prompt) -> None:
        if not isinstance(prompt, Seen):
            raise TypeError("a model that sees takes prompts read by its own engine")
        if req.logprobs:
            raise RequestError("logprobs are not available yet for a model that sees",
                               "logprobs")
        checked = check_request(self.tokenizer, req, self.vocab, self.window, prompt,
                                self.grammars)
        processors = list(checked.processors)
        if not model_checks.greedy_temperature(req.temperature):
            processors.append(_draws(checked.sampler))
        out = Output(self.tokenizer.detokenizer, req.stop, checked.markers, checked.thinking)
        calls = tool_calls.splitter(self.tokenizer, req, checked.args_check)
        self._waiting[req.id] = _Request(req.id, prompt, checked, processors, out, calls)

    def cancel(self, rid: str) -> None:
        if self._waiting.pop(rid, None) is not None:
            return
        r = self._by_rid.get(rid)
        if r is not None:
            self._gen.remove(r.uid)
            self._forget(r)

    def step(self) -> list[m.Event]:
        events: list[m.Event] = []
        if self._waiting:
            events += self._see(next(iter(self._waiting.values())))
        if not self._by_uid:
            return events
        prefilling = [r for r in self._by_uid.values() if r.prefilling]
        try:
            _, responses = self._gen.next()
        except Exception as e:  # noqa: BLE001 -- mlx raises many types; the batch is unusable
            log(f"batch step failed: {type(e).__name__}: {e}", ERR)
            failed: list[m.Event] = [m.Error(r.rid, "internal", f"{type(e).__name__}: {e}")
                                     for r in self._by_uid.values()]
            self._by_uid.clear()
            self._by_rid.clear()
            self._gen = self._new_generator()
            return events + failed
        for resp in responses:
            r = self._by_uid.get(resp.uid)
            if r is not None:
                events += self._on_token(r, resp)
        for r in prefilling:  # progress before the first token, for the hang watch
            if r.prefilling and r.uid in self._by_uid:
                r.prefilled = min(r.prompt_tokens, r.prefilled + self.prefill_step)
                events.append(m.Prefill(r.rid, r.prefilled, r.prompt_tokens))
        return events

    def abort_all(self, code: m.ErrorCode, message: str) -> list[m.Event]:
        rids = [*self._waiting, *self._by_rid]
        for rid in rids:
            self.cancel(rid)
        return [m.Error(rid, code, message) for rid in rids]

    def abort_prefilling(self, code: m.ErrorCode, message: str) -> list[m.Event]:
        rids = [*self._waiting, *(r.rid for r in self._by_rid.values() if r.prefilling)]
        for rid in rids:
            self.cancel(rid)
        return [m.Error(rid, code, message) for rid in rids]

    def serving(self) -> m.Serving:
        return m.Serving(batching="continuous", width=self.width, active=self.active,
                         prefill_step=self.prefill_step, prompt_tokens=self.prompt_tokens)

    # ---- inside ----------------------------------------------------------------------------
    def _see(self, r: _Request) -> list[m.Event]:
        """The request's pictures through the vision tower and into its prompt's embeddings,
        then into the generator: one request per step (the tower's work is bounded by the
        pictures' caps)."""
        del self._waiting[r.rid]
        try:
            features = self._embed(r.seen)
            (uid,) = self._gen.insert([list(r.seen.tokens)], max_tokens=[r.checked.max_tokens],
                                      prompt_kwargs=[features],
                                      logits_processors=[r.processors])
        except Exception as e:  # noqa: BLE001 -- a family's tower or merge refusing the input
            log(f"seeing {r.rid} failed: {type(e).__name__}: {e}", ERR)
            return [m.Error(r.rid, "internal", f"{type(e).__name__}: {e}")]
        r.uid = uid
        self._by_uid[uid] = self._by_rid[r.rid] = r
        self.prompt_tokens += r.prompt_tokens
        return [m.Prefill(r.rid, 0, r.prompt_tokens)]

    def _embed(self, seen: Seen) -> dict[str, Any]:
        """get_input_embeddings' features for the generator, evaluated (the tower runs here)."""
        inputs = dict(seen.inputs)
        ids = mx.array([list(seen.tokens)])
        pixels = inputs.pop("pixel_values", None)
        mask = inputs.pop("attention_mask", None)
        with self.features.seeing(seen.keys):
            got = self.model.get_input_embeddings(ids, pixels, mask=mask, **inputs)
        features = {k: v for k, v in got.to_dict().items()
                    if v is not None and k not in NOT_FOR_THE_LANGUAGE_MODEL}
        mx.eval(features)
        return features

    def _forget(self, r: _Request) -> None:
        self._by_uid.pop(r.uid, None)
        self._by_rid.pop(r.rid, None)

    def _on_token(self, r: _Request, resp: Any) -> list[m.Event]:
        r.prefilling = False
        r.completion_tokens += 1
        shown = show_token(r.rid, r.out, r.calls, resp.token, None, resp.finish_reason,
                           r.completion_tokens)
        if shown.early:  # a stop sequence or the one call wanted: it leaves the batch now
            self._gen.remove(r.uid)
        if shown.reason is None:
            return shown.events
        self._forget(r)
        return [*shown.events, done(r.rid, shown.reason, r.out, r.calls, r.prompt_tokens,
                                    r.completion_tokens)]


def _draws(sampler: Sampler) -> Processor:
    """The request's own sampler as its last logits processor: it draws the token from the
    logits as they are, and leaves only that one possible for the generator's greedy pick."""

    def process(_tokens: mx.array, logits: mx.array) -> mx.array:
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        token = sampler(logprobs)
        chosen = mx.arange(logits.shape[-1]) == token.reshape(-1, 1)
        return mx.where(chosen, mx.zeros_like(logits), mx.full(logits.shape, -mx.inf,
                                                                 dtype=logits.dtype))

    return process
