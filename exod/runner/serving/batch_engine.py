"""The serving engine of each rank: continuous batching with mlx-lm's own
`BatchGenerator`, a prompt (prefix) cache with mlx-lm's `LRUPromptCache`, prefill in chunks.

The serve loop calls `step()` over and over, and between two calls it picks up new requests,
cancels and stops. One step is one `BatchGenerator.next()`: one decode step for every request
past its prompt, plus at most one chunk of prompt for those still in prefill. The chunk is sized
so that a step never prefills more than `prefill_step` tokens in all, whatever the number of
prompts in flight: a cancel or a stop is therefore seen within one bounded step, even during a
very long prompt.

Requests join the running batch as they come (up to `width`, the instance's max_concurrency)
and leave it when they finish; each keeps its own sampler (a seed reproduces per request), logits
processors (logit bias, penalties, a grammar), and output (exod.runner.serving.output: streaming
detokenizer, stop sequences, reasoning apart, logprobs; then its tool calls).

Prompt cache: when a request ends, the KV cache of its prompt and completion is stored under
those tokens; a later request that shares a prefix with a stored entry (the next turn of a chat)
starts from it and prefills only the rest. Entries are evicted least recently used first once
their bytes pass `cache_bytes`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.generate import BatchGenerator
from mlx_lm.models.cache import LRUPromptCache, can_trim_prompt_cache, trim_prompt_cache

from exod import messages as m
from exod.config.schema import GrammarLimits
from exod.runner.serving.prepare import check_request, context_window, read_prompt, vocab_size
from exod.runner.log import ERR, log
from exod.runner.serving import tool_calls
from exod.runner.serving.gen_options import KvOptions
from exod.runner.serving.grammar import Grammars
from exod.runner.serving.logprobs import TokenText, entries
from exod.runner.serving.output import Output
from exod.runner.serving.reading import Prompt
from exod.runner.serving.token_events import done, show_token

CACHE_KEY = "model"  # LRUPromptCache keys entries by model too; a runner serves one
MIN_CHUNK = 32  # prefill chunks below this waste more in overhead than they buy in latency
PREFILL_BATCH = 8  # prompts prefilled together at most (mlx_lm.server's default)

__all__ = ["BatchEngine"]


@dataclass
class _Request:
    rid: str
    uid: int
    prompt_tokens: int
    out: Output
    calls: tool_calls.ToolCallSplitter | None = None
    top_logprobs: int | None = None  # None: no logprobs asked
    cached_tokens: int = 0
    completion_tokens: int = 0
    prefilling: bool = True
    prefilled: int = 0  # prompt tokens through the model so far (as reported, approximately)


@dataclass
class CacheStats:
    lookups: int = 0
    hits: int = 0
    cached_tokens: int = 0  # prompt tokens served from the cache instead of prefilled
    prompt_tokens: int = 0


class BatchEngine:
    def __init__(self, model: Any, tokenizer: Any, *, width: int, cache_bytes: int,
                 prefill_step: int = 256, grammar_limits: GrammarLimits | None = None,
                 kv: KvOptions | None = None,
                 on_new_generator: Callable[[], None] | None = None) -> None:
        """kv: the caches' options (here, max_kv_size: a rotating cache per request).
        on_new_generator: called after each BatchGenerator is made (mlx-lm's sets the wired
        limit of Metal as it is made; the instance's own setting goes back on after it)."""
        self.model, self.tokenizer = model, tokenizer
        self.kv = kv or KvOptions()
        self._on_new_generator = on_new_generator
        self.width = max(1, width)
        self.prefill_step = max(MIN_CHUNK, prefill_step)
        self.cache_bytes = max(0, cache_bytes)
        self.vocab = vocab_size(model, tokenizer)
        self.window = context_window(model)
        self.text = TokenText(tokenizer)
        self.grammars = Grammars(tokenizer, self.vocab, grammar_limits or GrammarLimits())
        self._cache = LRUPromptCache(max_size=1 << 30, max_bytes=self.cache_bytes)
        self._counts = CacheStats()
        self._by_uid: dict[int, _Request] = {}
        self._by_rid: dict[str, _Request] = {}
        self._gen = self._new_generator()
        self.failed_steps = 0  # a group must not go on after one (exod.runner.group.lockstep)

    def _new_generator(self) -> BatchGenerator:
        eos = sorted(int(t) for t in self.tokenizer.eos_token_ids)
        gen = BatchGenerator(
            self.model, stop_tokens=[[t] for t in eos],
            completion_batch_size=self.width,
            prefill_batch_size=min(self.width, PREFILL_BATCH),
            prefill_step_size=self.prefill_step,
        )
        if self._on_new_generator is not None:
            self._on_new_generator()
        return gen

    # ---- the interface the serve loop uses ------------------------------------------------
    @property
    def busy(self) -> bool:
        return bool(self._by_uid)

    @property
    def active(self) -> int:
        return len(self._by_uid)

    def read(self, req: m.Generate) -> Prompt:
        """Its prompt, read and checked: tokenizer and Python only, safe on any thread."""
        return read_prompt(self.tokenizer, req, self.vocab, self.window, self.grammars)

    def admit(self, req: m.Generate, read: Prompt | None = None) -> None:
        """Queue a request into the batch; RequestError if it cannot be served as given.
        `read`: its prompt as `read` returned it (without: read here)."""
        rid = req.id
        checked = check_request(self.tokenizer, req, self.vocab, self.window, read,
                                self.grammars)
        prompt = checked.prompt
        cache, rest = self._lookup(prompt)
        if cache is None and self.kv.max_size is not None:
            cache = self.kv.make(self.model)  # BatchGenerator's own would not rotate (llama)
        (uid,) = self._gen.insert(
            # None: BatchGenerator makes a fresh cache (its type hint says list, it means this)
            [rest], max_tokens=[checked.max_tokens],
            caches=[cache] if cache is not None else None, samplers=[checked.sampler],
            all_tokens=[prompt[: len(prompt) - len(rest)]],
            logits_processors=[checked.processors])
        out = Output(self.tokenizer.detokenizer, req.stop, checked.markers, checked.thinking)
        calls = tool_calls.splitter(self.tokenizer, req, checked.args_check)
        r = _Request(rid, uid, len(prompt), out, calls,
                     checked.top_logprobs, cached_tokens=len(prompt) - len(rest))
        self._by_uid[uid] = self._by_rid[rid] = r

    def cancel(self, rid: str) -> None:
        """Drop a request (its client left): its slot is free before the next step."""
        r = self._by_rid.get(rid)
        if r is not None:
            self._gen.remove([r.uid])
            self._forget(r)

    def step(self) -> list[m.Event]:
        if not self._by_uid:
            return []
        self._size_chunks()
        prefilling = [r for r in self._by_uid.values() if r.prefilling]
        try:
            _, responses = self._gen.next()
        except Exception as e:  # noqa: BLE001 -- mlx raises many types; the batch is unusable
            # Not abort_all: it would ask the broken generator to remove them. A new one instead.
            log(f"batch step failed: {type(e).__name__}: {e}", ERR)
            self.failed_steps += 1
            failed: list[m.Event] = [m.Error(r.rid, "internal", f"{type(e).__name__}: {e}")
                                     for r in self._by_uid.values()]
            self._by_uid.clear()
            self._by_rid.clear()
            self._gen = self._new_generator()
            return failed
        events: list[m.Event] = []
        logprobs = self._logprobs(responses)
        for resp in responses:
            r = self._by_uid.get(resp.uid)
            if r is not None:
                events += self._on_token(r, resp, logprobs.get(resp.uid))
        # Progress of prompts still going through the model (no token yet): hang detection in
        # the daemon counts it, so a long prompt is never taken for a hung runner.
        for r in prefilling:
            if r.prefilling and r.uid in self._by_uid:
                r.prefilled = min(r.prompt_tokens, r.prefilled + self._gen.prefill_step_size)
                events.append(m.Prefill(r.rid, r.prefilled, r.prompt_tokens))
        return events

    def abort_all(self, code: m.ErrorCode, message: str) -> list[m.Event]:
        events: list[m.Event] = [m.Error(r.rid, code, message) for r in self._by_uid.values()]
        if self._by_uid:
            self._gen.remove(list(self._by_uid))
        self._by_uid.clear()
        self._by_rid.clear()
        return events

    def abort_prefilling(self, code: m.ErrorCode, message: str) -> list[m.Event]:
        waiting = [r for r in self._by_uid.values() if r.prefilling]
        if waiting:
            self._gen.remove([r.uid for r in waiting])
        for r in waiting:
            self._forget(r)
        return [m.Error(r.rid, code, message) for r in waiting]

    def serving(self) -> m.Serving:
        c = self._counts
        return m.Serving(
            batching="continuous", width=self.width, active=self.active,
            prefill_step=self.prefill_step, cache_max_bytes=self.cache_bytes,
            cache_entries=len(self._cache), cache_bytes=int(self._cache.nbytes),
            cache_lookups=c.lookups, cache_hits=c.hits, cached_tokens=c.cached_tokens,
            prompt_tokens=c.prompt_tokens)

    # ---- a group's other ranks follow rank 0's prompt cache (exod.runner.group.lockstep) -----
    # Their entries hold other bytes (other layers, stand-ins), so evicting by their own byte
    # count would make them hit where rank 0 misses. They evict nothing themselves; rank 0's
    # entry count after each step is enough to evict the same entries, the oldest first.
    def follow_cache(self) -> None:
        self._cache.max_bytes = 1 << 62

    @property
    def cache_entries(self) -> int:
        return len(self._cache)

    def trim_cache(self, entries: int) -> None:
        self._cache.trim_to(n_sequences=entries)

    # ---- inside ----------------------------------------------------------------------------
    def _lookup(self, prompt: list[int]) -> tuple[list[Any] | None, list[int]]:
        """The stored KV cache nearest to `prompt` and the tokens it does not cover yet."""
        self._counts.lookups += 1
        self._counts.prompt_tokens += len(prompt)
        if self.cache_bytes == 0:
            return None, prompt
        cache, rest = self._cache.fetch_nearest_cache(CACHE_KEY, prompt)
        if cache is not None and not rest:
            # An exact hit: the last prompt token must still run, for its logits.
            if not can_trim_prompt_cache(cache):
                return None, prompt
            trim_prompt_cache(cache, 1)
            rest = prompt[-1:]
        if cache is None:
            return None, prompt
        self._counts.hits += 1
        self._counts.cached_tokens += len(prompt) - len(rest)
        return cache, list(rest)

    def _store(self, tokens: list[int], cache: list[Any] | None) -> None:
        if self.cache_bytes and cache and tokens:
            # Extracted from the batch as lazy copies that still reference the whole batch's
            # buffers: once evaluated, an entry holds only its own rows (its nbytes, which the
            # byte cap counts, comes from its shapes either way). Evaluated in the background:
            # a synchronous copy here held back every token of this step (tens of ms under
            # load), and nothing needs the entry before a later request looks it up.
            mx.async_eval([c.state for c in cache])
            self._cache.insert_cache(CACHE_KEY, list(tokens), cache)

    def _size_chunks(self) -> None:
        """Split the step's prefill budget between the prompts that will be prefilled together,
        so one step stays bounded however many long prompts arrive at once."""
        prefilling = sum(r.prefilling for r in self._by_uid.values())
        together = max(1, min(prefilling, self._gen.prefill_batch_size))
        self._gen.prefill_step_size = max(MIN_CHUNK, self.prefill_step // together)

    def _forget(self, r: _Request) -> None:
        self._by_uid.pop(r.uid, None)
        self._by_rid.pop(r.rid, None)

    def _logprobs(self, responses: list[Any]) -> dict[int, m.TokenLogprob]:
        """The entries of this step's tokens, for the requests that asked."""
        wanted = [(resp, r) for resp in responses
                  if (r := self._by_uid.get(resp.uid)) is not None and r.top_logprobs is not None]
        if not wanted:
            return {}
        got = entries([resp.logprobs for resp, _ in wanted], [resp.token for resp, _ in wanted],
                      [r.top_logprobs or 0 for _, r in wanted], self.text)
        return {resp.uid: e for (resp, _), e in zip(wanted, got, strict=True)}

    def _on_token(self, r: _Request, resp: Any, entry: m.TokenLogprob | None) -> list[m.Event]:
        r.prefilling = False
        r.completion_tokens += 1
        shown = show_token(r.rid, r.out, r.calls, resp.token, entry, resp.finish_reason,
                           r.completion_tokens)
        # A stop sequence, or the one call a request without parallel_tool_calls wanted: the
        # request leaves the batch now, its cache with it.
        if shown.early:
            caches = self._gen.remove([r.uid], return_prompt_caches=True)
            cache, tokens = caches.get(r.uid, (None, []))
            self._store(tokens, cache)
        elif shown.reason is not None:
            self._store(resp.all_tokens or [], resp.prompt_cache)
        if shown.reason is None:
            return shown.events
        self._forget(r)
        return [*shown.events, done(r.rid, shown.reason, r.out, r.calls, r.prompt_tokens,
                                    r.completion_tokens, r.cached_tokens)]
