"""The serving engine of each rank: continuous batching with mlx-lm's own `BatchGenerator`, a
prompt (prefix) cache in RAM and on disk (exod.runner.prompt_cache.tiers), prefill in chunks.

The serve loop calls `step()` over and over, and between two calls it picks up new requests,
cancels and stops. One step is one `BatchGenerator.next()`: a decode step for every request past
its prompt, plus at most `prefill_step` prompt tokens in all; a disk entry loads a bounded number
of bytes a step (exod.runner.serving.disk_loads). So a cancel or a stop is seen within a step.

Up to `width` requests (max_concurrency) are in the batch; the others wait here, and the fair
share picks whom to start when a row frees (exod.runner.serving.fair_share), holding `batch`
work back between steps for interactive work (exod.runner.serving.holding). Each keeps its own
sampler, grammar and processors, run by the batch's one sampler (exod.runner.serving.
batch_sampler). On a group's ranks (exod.runner.group.lockstep), `agree` says when every rank has
the disk entry rank 0 chose. docs/api.md, "Batching and the prompt cache".
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from mlx_lm.generate import BatchGenerator
from mlx_lm.models.cache import ArraysCache, KVCache

from exod.wire import messages as m
from exod.wire.options import GrammarLimits
from exod.runner.serving.prepare import check_request, context_window, read_prompt, vocab_size
from exod.runner.link.log import ERR, log
from exod.runner.serving import tool_calls
from exod.runner.serving.gen_options import Draft, KvOptions
from exod.runner.serving.batch_request import BatchRequest
from exod.runner.serving.batch_sampler import BatchSampler, generator_rows
from exod.runner.serving.disk_loads import Agree, step_loads
from exod.runner.serving.engine_stats import serving_stats
from exod.runner.serving.grammar import Grammars
from exod.runner.serving.speculative import SpeculativeGenerator
from exod.runner.serving.mask_round import MaskRound
from exod.runner.serving.logprobs import TokenText, entries
from exod.runner.serving.loop import AsItComes
from exod.runner.serving.detokenize import streaming
from exod.runner.serving.output import Output
from exod.runner.serving.reading import Prompt
from exod.runner.prompt_cache.disk import DiskTier
from exod.runner.prompt_cache.tiers import PromptCache
from exod.runner.serving.fair_share import FairShare
from exod.runner.serving.forks import Forks
from exod.runner.serving.starts import OWN, DiskChoice, Starts
from exod.runner.serving.turns import Turns
from exod.runner.serving.shared_prefix import Sharing
from exod.runner.serving.token_events import done, show_token

MIN_CHUNK = 32  # prefill chunks below this waste more in overhead than they buy in latency
PREFILL_BATCH = 8  # prompts prefilled together at most (mlx_lm.server's default)


__all__ = ["BatchEngine", "DiskChoice", "OWN"]


class BatchEngine(AsItComes):
    def __init__(self, model: Any, tokenizer: Any, *, width: int, cache_bytes: int,
                 prefill_step: int = 256, grammar_limits: GrammarLimits | None = None,
                 kv: KvOptions | None = None, draft: Draft | None = None,
                 on_new_generator: Callable[[], None] | None = None,
                 disk: DiskTier | None = None, agree: Agree | None = None,
                 fair: bool = True) -> None:
        """kv: the caches' options (max_kv_size: a rotating cache per request; kv_bits: a
        quantized batch, exod.runner.serving.quantized_batch).
        on_new_generator: called after each BatchGenerator is made (mlx-lm's sets the wired
        limit of Metal as it is made; the instance's own setting goes back on after it).
        disk: the prompt cache's disk tier (None: RAM only). agree: a group's all-reduce.
        draft: speculative decoding in the batch (exod.runner.serving.speculative).
        fair: share the batch between keys; False: first come first served (`bench fair`)."""
        self.model, self.tokenizer = model, tokenizer
        self.kv = kv or KvOptions()
        self.draft = draft
        self._on_new_generator = on_new_generator
        self.width = max(1, width)
        self.prefill_step = max(MIN_CHUNK, prefill_step)
        self.cache_bytes = max(0, cache_bytes)
        self.vocab = vocab_size(model, tokenizer)
        self.window = context_window(model)
        self.text = TokenText(tokenizer)
        self.grammars = Grammars(tokenizer, self.vocab, grammar_limits or GrammarLimits())
        self.cache = PromptCache(self.cache_bytes, disk)
        self.agree = agree
        # Keep the cache of a prompt before its answer too: the whole entry cannot be trimmed
        # back to it (a hybrid model's recurrent state, a rotating window that may wrap).
        caches = self.kv.make(model)
        self._checkpoint = not all(type(c) is KVCache for c in caches)
        # Prompts of different lengths are prefilled together padded on the right, and several
        # families' recurrent layers (mamba, jamba, olmo_hybrid...) carry the padding into
        # their state: the shorter prompt's answer changes. Those prompts go one at a time.
        self._recurrent = any(isinstance(c, ArraysCache) or any(
            isinstance(x, ArraysCache) for x in getattr(c, "caches", ())) for c in caches)
        # Prompts that share a prefix with one in flight wait for its cache (shared_prefix).
        self._sharing = Sharing(self.prefill_step, exact=not self._checkpoint)
        self._by_uid: dict[int, BatchRequest] = {}
        self._by_rid: dict[str, BatchRequest] = {}  # every request, loading or in the batch
        self._starts = Starts(self.cache, self._sharing, self._by_rid, self._by_uid, self._insert)
        self._forks = Forks(self._sharing, self._by_rid, self.cache, self._insert,
                            self._starts.alone)
        self._warm_ids = itertools.count()
        self._masks = MaskRound()  # the grammars' masks of a step, at once
        self._sampling: BatchSampler | None = None  # every row's, with each generator
        self._gen = self._new_generator()
        self.failed_steps = 0  # a group must not go on after one (exod.runner.group.lockstep)
        self.share = FairShare("fair" if fair else "fifo")
        self._turns = Turns(self.share, self._by_rid, self._by_uid, self.width,
                            lambda r: self._starts.start(r, r.disk), self._put,
                            self._on_token, self._starts.release, self.text,
                            {int(t) for t in tokenizer.eos_token_ids}, self._follows)

    def _new_generator(self) -> BatchGenerator:
        eos = sorted(int(t) for t in self.tokenizer.eos_token_ids)
        how: dict[str, Any] = {
            "stop_tokens": [[t] for t in eos], "completion_batch_size": self.width,
            "prefill_batch_size": 1 if self._recurrent else min(self.width, PREFILL_BATCH),
            "prefill_step_size": self.prefill_step}
        gen = BatchGenerator(self.model, **how) if self.draft is None \
            else SpeculativeGenerator(self.model, self.draft, **how)
        if self._on_new_generator is not None:
            self._on_new_generator()
        rows = generator_rows(gen)
        self._sampling = BatchSampler(self._masks, rows) if rows is not None else None
        return gen

    # ---- the interface the serve loop uses ------------------------------------------------
    @property
    def busy(self) -> bool:
        return bool(self._by_rid)

    @property
    def active(self) -> int:
        """Requests admitted and not finished (warm-ups not counted)."""
        return sum(r.out is not None for r in self._by_rid.values())

    @property
    def background(self) -> bool:
        """Work of its own (a warm-up) that the serve loop must step with no request in flight."""
        return any(r.out is None for r in self._by_rid.values())

    def read(self, req: m.Generate) -> Prompt:
        """Its prompt, read and checked: tokenizer and Python only, safe on any thread."""
        return read_prompt(self.tokenizer, req, self.vocab, self.window, self.grammars)

    def admit(self, req: m.Generate, read: Prompt | None = None,
              disk: DiskChoice | None = OWN) -> DiskChoice | None:
        """Queue a request into the batch; RequestError if it cannot be served as given.
        `read`: its prompt as `read` returned it (without: read here). `disk`: OWN to look the
        prompt up here; else rank 0's choice for it (a group's other ranks). Returns the disk
        entry chosen, if any (rank 0 tells the other ranks)."""
        checked = check_request(self.tokenizer, req, self.vocab, self.window, read,
                                self.grammars, batched=self._sampling is not None)
        out = Output(streaming(self.tokenizer.detokenizer), req.stop, checked.markers,
                     checked.thinking)
        r = BatchRequest(req.id, checked.prompt, out,
                         tool_calls.splitter(self.tokenizer, req, checked.args_check,
                                             checked.prompt),
                         checked.top_logprobs, insert={
                             "max_tokens": [checked.max_tokens],
                             "logits_processors": [checked.processors]},
                         sampler=checked.sampler, grammar=checked.grammar,
                         limit=checked.max_tokens)
        self._by_rid[r.rid] = r
        self.share.arrive(r.rid, req.key, req.weight, req.priority)
        if self.share.next() == r.rid and self._turns.room(self._gen, r):
            self.share.start(r.rid)
            return self._starts.start(r, disk)
        # It waits: rank 0 of a group decides its disk entry now, for every rank to start alike.
        r.waiting = True
        if disk is OWN and self.agree is not None:
            match = self.cache.disk_choice(r.prompt)
            disk = (match.entry.key, match.usable) if match is not None else None
        r.disk = disk
        return None if disk is OWN else disk

    def warm(self, tokens: list[int], force: bool = False) -> bool:
        """Prefill `tokens` into the prompt cache (an agent's system prompt and tools, before
        anyone asks), unless a tier already holds them; whether it will. `force`: a group's
        other ranks, which do what rank 0 decided."""
        if not tokens or not self.cache.enabled or (not force and self.cache.holds(tokens)):
            return False
        r = BatchRequest(f"warm-{next(self._warm_ids)}", list(tokens), None,
                         insert={"max_tokens": [1]})
        self._starts.start(r, None, counted=False)  # a warm-up is no request's lookup
        return True

    def _follows(self, r: BatchRequest) -> bool:
        return self._sharing.choose(r.prompt, 0, self._by_uid.values()) is not None

    def _drop_row(self, uid: int) -> None:
        if self._sampling is not None:
            self._sampling.drop(uid)

    def _insert(self, r: BatchRequest, cache: list[Any] | None, covered: int) -> None:
        """Into the batch, from `cache` (covering `covered` prompt tokens) or from nothing."""
        self._put(r, cache, r.prompt[:covered], r.prompt[covered:])
        r.cached_tokens = covered

    def _put(self, r: BatchRequest, cache: list[Any] | None, held: list[int],
             feed: list[int]) -> None:
        """Into the batch: `cache` holds the tokens `held`, `feed` goes through the model."""
        cache = self.kv.for_batch(self.model, cache)  # rotating, quantized: not BatchGenerator's
        (r.uid,) = self._gen.insert(
            # None: BatchGenerator makes a fresh cache (its type hint says list, it means this)
            [feed], caches=[cache] if cache is not None else None, all_tokens=[held],
            samplers=[self._sampling if self._sampling is not None else r.sampler], **r.insert)
        if self._sampling is not None:
            self._sampling.add(r.uid, r.sampler, r.grammar)
        r.base = r.in_cache = len(held)
        self._by_uid[r.uid] = r
        self._sharing.loaded(r.rid)

    def cancel(self, rid: str) -> None:
        """Drop a request (its client left): its slot is free before the next step."""
        r = self._by_rid.get(rid)
        if r is not None:
            self._drop([r])

    def step(self) -> list[m.Event]:
        if not self._by_rid:
            return []
        events = self._turns.before_step(self._gen, self.draft is None, self._drop_row)
        events += step_loads(list(self._by_rid.values()), self.cache, self.agree,
                            self._insert, stepping=bool(self._by_uid))
        if not self._by_uid:
            return events
        events += self._forks.due(self._gen, self.prefill_step)
        self._size_chunks()
        prefilling = [r for r in self._by_uid.values() if r.prefilling]
        if self._sampling is not None:
            self._sampling.begin()
        try:
            prompts, responses = self._gen.next()
        except Exception as e:  # noqa: BLE001 -- mlx raises many types; the batch is unusable
            # Not abort_all: it would ask the broken generator to remove them. A new one instead.
            log(f"batch step failed: {type(e).__name__}: {e}", ERR)
            self.failed_steps += 1
            # Those waiting or held back were not in it: they start in the new one.
            started = [r for r in self._by_rid.values() if not r.waiting]
            failed: list[m.Event] = [m.Error(r.rid, "internal", f"{type(e).__name__}: {e}")
                                     for r in started if r.out is not None]
            self._drop(started, in_batch=False)
            self._gen = self._new_generator()  # and a batch sampler of its own
            return events + failed
        for p in prompts:  # how far each prompt is: a follower's leader is due when
            if (r := self._by_uid.get(p.uid)) is not None:
                through = r.base + p.progress[0]
                self.share.served(r.rid, through - r.in_cache)
                r.in_cache = through
        if self._checkpoint:
            self._keep_prompts(prompts)
        logprobs = self._logprobs(responses)  # a speculating row has several a step
        for n, resp in enumerate(responses):
            r = self._by_uid.get(resp.uid)
            if r is not None:
                self.share.served(r.rid, 1)
                events += self._on_token(r, resp, logprobs.get(n))
        # Progress of prompts still going through the model (no token yet): hang detection in
        # the daemon counts it, so a long prompt is never taken for a hung runner.
        for r in prefilling:
            if r.prefilling and r.uid in self._by_uid and r.out is not None:
                r.prefilled = min(r.prompt_tokens, r.prefilled + self._gen.prefill_step_size)
                events.append(m.Prefill(r.rid, r.prefilled, r.prompt_tokens))
        return events

    def abort_all(self, code: m.ErrorCode, message: str) -> list[m.Event]:
        gone = list(self._by_rid.values())
        self._drop(gone)
        return [m.Error(r.rid, code, message) for r in gone if r.out is not None]

    def abort_prefilling(self, code: m.ErrorCode, message: str) -> list[m.Event]:
        waiting = [r for r in self._by_rid.values() if r.prefilling]
        self._drop(waiting)
        return [m.Error(r.rid, code, message) for r in waiting if r.out is not None]

    def serving(self) -> m.ServingReport:
        return serving_stats(self.cache, width=self.width, active=self.active,
                             prefill_step=self.prefill_step, cache_bytes=self.cache_bytes,
                             draft=self.draft, fair=self.share.policy == "fair")

    # ---- the prompt cache, behind the requests -------------------------------------------------
    def idle(self) -> None:
        """Nothing in flight: RAM's entries not on disk yet go to the disk's writer."""
        self.cache.idle()

    def save_cache(self, deadline: float) -> None:
        """The stop: write what is not on disk yet, until `deadline` (time.monotonic)."""
        self.cache.flush(deadline)

    def clear_cache(self) -> None:
        self.cache.clear()

    # ---- a group's other ranks follow rank 0's prompt cache (exod.runner.group.lockstep) -----
    # Their entries hold other bytes (other layers, stand-ins), so evicting by their own byte
    # count would make them hit where rank 0 misses. They evict nothing themselves; rank 0's
    # entry count after each step is enough to evict the same entries, the oldest first.
    def follow_cache(self) -> None:
        self.cache.follow()

    @property
    def cache_entries(self) -> int:
        return len(self.cache.ram)

    def trim_cache(self, entries: int) -> None:
        self.cache.trim_to(entries)

    # ---- inside ----------------------------------------------------------------------------
    def _keep_prompts(self, prompts: list[Any]) -> None:
        """The cache of each prompt whose last segment (all of it but its last token) was just
        prefilled: an entry the same prompt can start from again."""
        ends = [p.uid for p in prompts
                if p.end_of_segment and not p.end_of_prompt and p.uid in self._by_uid]
        if ends:
            for cache, tokens in self._gen.extract_cache(ends).values():
                self.cache.store(list(tokens), cache)

    def _store(self, tokens: list[int], cache: list[Any] | None) -> None:
        if cache:
            self.cache.store(list(tokens), cache)

    def _drop(self, gone: list[BatchRequest], in_batch: bool = True) -> None:
        """Take requests out (a cancel, an abort): out of the batch, or their load dropped."""
        for r in gone:
            self._sharing.drop(r.rid)
        uids = [r.uid for r in gone if r.uid >= 0]
        if uids and in_batch:
            self._gen.remove(uids)
        for r in gone:
            if r.load is not None:
                self.cache.dropped(r.load)
                r.load = None
            self._forget(r)

    def _size_chunks(self) -> None:
        """Split the step's prefill budget between the prompts that will be prefilled together,
        so one step stays bounded however many long prompts arrive at once."""
        prefilling = sum(r.prefilling for r in self._by_uid.values())
        together = max(1, min(prefilling, self._gen.prefill_batch_size))
        self._gen.prefill_step_size = max(MIN_CHUNK, self.prefill_step // together)

    def _forget(self, r: BatchRequest) -> None:
        if r.grammar is not None:
            r.grammar.retire()
        if self._sampling is not None:
            self._sampling.drop(r.uid)
        self._by_uid.pop(r.uid, None)
        self._by_rid.pop(r.rid, None)
        self.share.gone(r.rid)
        r.held = None
        self._forks.gone(r)

    def _logprobs(self, responses: list[Any]) -> dict[int, m.TokenLogprob]:
        """The entries of this step's tokens, for the requests that asked, by their place."""
        wanted = [(n, resp, r) for n, resp in enumerate(responses)
                  if (r := self._by_uid.get(resp.uid)) is not None and r.top_logprobs is not None]
        if not wanted:
            return {}
        got = entries([resp.logprobs for _, resp, _ in wanted],
                      [resp.token for _, resp, _ in wanted],
                      [r.top_logprobs or 0 for _, _, r in wanted], self.text)
        return {n: e for (n, _, _), e in zip(wanted, got, strict=True)}

    def _on_token(self, r: BatchRequest, resp: Any, entry: m.TokenLogprob | None) -> list[m.Event]:
        r.prefilling = False
        r.completion_tokens += 1
        if r.out is None:  # a warm-up: its one token ends it, its cache is what it was for
            self._store(resp.all_tokens or [], resp.prompt_cache)
            self._forget(r)
            return []
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
