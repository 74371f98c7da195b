"""The turn-taking engine, for a single rank whose model mlx-lm cannot batch
(exod.runner.serving.can_batch): each request steps through mlx-lm's `generate_step` on its own,
one token of each running request per step, with no prompt cache.

The prompt goes through the model here, one chunk per step, before `generate_step` takes over
for its last token, so the serve loop can drop the request (a cancel) or end it (a stop) within
one chunk, as the batch engine does. mlx-lm's own chunked prefill would run the whole prompt
inside one step. The instance's KV cache options (quantized, rotating) and speculative
decoding with a draft model where the batch cannot take it (with a quantized cache, or a model
whose caches the batch cannot rewind by row: exod.runner.serving.speculative) run here, as
mlx-lm runs them without batching: the prompt goes through the draft model too, and
`speculative_generate_step` takes over for the last token. What a generation shows (text,
reasoning, logprobs, then tool calls) comes from exod.runner.serving.output, as in the batch
engine.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import mlx.core as mx
from mlx_lm.generate import generate_step, generation_stream, speculative_generate_step
from mlx_lm.models.cache import make_prompt_cache

from exod.wire import messages as m
from exod.wire.options import GrammarLimits
from exod.runner.serving.prepare import (Processor, check_request, context_window, read_prompt,
                                         vocab_size)
from exod.runner.link.log import ERR, log
from exod.runner.serving import tool_calls
from exod.runner.serving.gen_options import Draft, KvOptions
from exod.runner.serving.grammar import Grammars
from exod.runner.serving.logprobs import TokenText, entries
from exod.runner.serving.loop import AsItComes, NoPromptCache
from exod.runner.serving.detokenize import streaming
from exod.runner.serving.output import Output
from exod.runner.serving.reading import Prompt
from exod.runner.serving.token_events import show_token

# As exod.runner.serving.batch_engine: smaller chunks cost more in overhead than they buy.
MIN_CHUNK = 32


class Generation:
    def __init__(self, model: Any, tokenizer: Any, req: m.Generate, read: Prompt,
                 text: TokenText, kv: KvOptions | None = None, draft: Draft | None = None
                 ) -> None:
        self.id = req.id
        self.model = model
        self._kv = kv = kv or KvOptions()
        self._draft = draft
        checked = check_request(tokenizer, req, vocab_size(model, tokenizer),
                                context_window(model), read)
        self._calls = tool_calls.splitter(tokenizer, req, checked.args_check, checked.prompt)
        prompt = checked.prompt
        self._cache: list[Any] = kv.make(model)
        # The draft's cache follows the model's in the list speculative_generate_step takes.
        self._draft_cache: list[Any] = [] if draft is None else make_prompt_cache(draft.model)
        self._pending = prompt[:-1]  # prefilled by `prefill`; the last token by generate_step
        last, seeing = mx.array(prompt[-1:]), _seeing(prompt[:-1], checked.processors)
        self._tokens: Iterator[tuple[Any, ...]]
        if draft is None:
            self._tokens = generate_step(
                last, model, prompt_cache=self._cache, max_tokens=checked.max_tokens,
                sampler=checked.sampler, logits_processors=seeing, **kv.generate_kwargs())
        else:
            self._tokens = speculative_generate_step(
                last, model, draft.model, prompt_cache=self._cache + self._draft_cache,
                num_draft_tokens=draft.tokens, max_tokens=checked.max_tokens,
                sampler=checked.sampler, logits_processors=seeing, **kv.generate_kwargs())
        self._eos = set(int(t) for t in tokenizer.eos_token_ids)
        self._max_tokens = checked.max_tokens
        self._top = checked.top_logprobs
        self._text = text
        self._out = Output(streaming(tokenizer.detokenizer), req.stop, checked.markers,
                           checked.thinking)
        self.prompt_tokens = len(prompt)
        self.completion_tokens = 0
        self.prefilled = 0
        self.started = False  # it has produced a token (its whole prompt has been read)

    @property
    def prefilling(self) -> bool:
        return bool(self._pending)

    def prefill(self, chunk: int) -> None:
        """Run the next `chunk` prompt tokens through the model (and the group) into the cache."""
        tokens, self._pending = self._pending[:chunk], self._pending[chunk:]
        self.prefilled += len(tokens)
        with mx.stream(generation_stream):  # where generate_step will read the cache
            pairs = [(self.model, self._cache)]
            if self._draft is not None:
                pairs.append((self._draft.model, self._draft_cache))
            for model, cache in pairs:
                model(mx.array(tokens)[None], cache=cache)
                self._kv.after_chunk(cache)  # as generate_step does after each chunk
                mx.eval([c.state for c in cache])
        mx.clear_cache()

    def step(self) -> tuple[list[m.Event], m.FinishReason | None]:
        """Generate one token: (what it shows now, finish reason or None while going on)."""
        token, logprobs, *drafted = next(self._tokens)
        token = int(token)
        if self._draft is not None:  # speculative_generate_step says whether the draft's
            if drafted[0]:
                self._draft.accepted += 1
            else:  # the model's own token ends each round of drafts
                self._draft.drafted += self._draft.tokens
        self.started = True
        self.completion_tokens += 1
        eos = token in self._eos
        last = eos or self.completion_tokens >= self._max_tokens
        entry = None
        if self._top is not None and not eos:
            (entry,) = entries([logprobs], [token], [self._top], self._text)
        shown = show_token(self.id, self._out, self._calls, token, entry,
                           "stop" if eos else "length" if last else None,
                           self.completion_tokens)
        if shown.early:
            self.close()
        reason = None if shown.reason is None \
            else tool_calls.finish_reason(shown.reason, self._calls)
        return shown.events, reason

    def close(self) -> None:
        close = getattr(self._tokens, "close", None)
        if close is not None:
            close()

    def done(self, finish_reason: m.FinishReason) -> m.Done:
        return m.Done(self.id, finish_reason, self.prompt_tokens, self.completion_tokens,
                      self._out.stops.matched, reasoning_tokens=self._out.reasoning_tokens)


class TurnEngine(NoPromptCache, AsItComes):
    """Generations take turns, one token each per step (see exod.runner.serving.loop.Engine).
    No prompt cache: mlx-lm's quantized, speculative and unbatchable paths keep none."""

    def __init__(self, model: Any, tokenizer: Any, width: int, prefill_step: int,
                 why: str, grammar_limits: GrammarLimits | None = None,
                 kv: KvOptions | None = None, draft: Draft | None = None) -> None:
        self.model, self.tokenizer, self.width, self.why = model, tokenizer, width, why
        self.kv, self.draft = kv or KvOptions(), draft
        self.grammars = Grammars(tokenizer, vocab_size(model, tokenizer),
                                 grammar_limits or GrammarLimits())
        self.prefill_step = max(MIN_CHUNK, prefill_step)
        self.gens: dict[str, Generation] = {}
        self.text = TokenText(tokenizer)

    @property
    def active(self) -> int:
        return len(self.gens)

    def read(self, req: m.Generate) -> Prompt:
        return read_prompt(self.tokenizer, req, vocab_size(self.model, self.tokenizer),
                           context_window(self.model), self.grammars)

    def admit(self, req: m.Generate, prompt: Prompt) -> None:
        self.gens[req.id] = Generation(self.model, self.tokenizer, req, prompt, self.text,
                                       self.kv, self.draft)

    def cancel(self, rid: str) -> None:
        gen = self.gens.pop(rid, None)
        if gen is not None:
            gen.close()

    def step(self) -> list[m.Event]:
        """A token of every generation past its prompt, and one chunk of every prompt being
        read (sized so that the step prefills at most `prefill_step` tokens in all)."""
        out: list[m.Event] = []
        prefilling = sum(g.prefilling for g in self.gens.values())
        chunk = max(MIN_CHUNK, self.prefill_step // max(1, prefilling))
        for rid, gen in list(self.gens.items()):
            try:
                if gen.prefilling:
                    gen.prefill(chunk)
                    # Progress before the first token: hang detection counts it as such.
                    out.append(m.Prefill(rid, gen.prefilled, gen.prompt_tokens))
                    continue
                events, reason = gen.step()
            except Exception as e:  # noqa: BLE001 -- mlx raises many types: fail this one, go on
                log(f"generation {rid} failed: {type(e).__name__}: {e}", ERR)
                self.cancel(rid)
                out.append(m.Error(rid, "internal", f"{type(e).__name__}: {e}"))
                continue
            out += events
            if not events and reason is None:  # a token all the same: progress (hang watch)
                out.append(m.Held(rid, max(1, gen.completion_tokens)))
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

    def serving(self) -> m.ServingReport:
        why = self.why if self.draft is None else f"{self.why}; {self.draft.describe()}"
        d = self.draft
        return m.ServingReport(batching=why, width=self.width, active=self.active,
                         prefill_step=self.prefill_step, draft_tokens=d.tokens if d else 0,
                         drafted=d.drafted if d else 0, draft_accepted=d.accepted if d else 0)


def _seeing(prefilled: list[int], processors: list[Processor]) -> list[Processor] | None:
    """The processors, shown the whole prompt before the tokens generate_step gives them: it
    is handed only the prompt's last token (the rest went through `prefill`), and a penalty
    must see what mlx-lm's own generate shows it."""
    if not processors:
        return None
    head = mx.array(prefilled, dtype=mx.uint32)

    def whole(process: Processor) -> Processor:
        return lambda tokens, logits: process(mx.concatenate([head, tokens.astype(head.dtype)]),
                                              logits)

    return [whole(p) for p in processors]
