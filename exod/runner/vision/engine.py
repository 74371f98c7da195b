"""The serving engine of a model that sees: requests with and without pictures batched together
in mlx-vlm's `BatchGenerator`, behind the serve loop's Engine interface, as BatchEngine is.

A request is read (exod.runner.vision.prompt, the reader's thread), admitted, then *seen* (one
step, one request: the vision tower or its cached output, exod.runner.vision.features, merged
into the prompt's embeddings, keeping only the features the language model reads: the others
break a batch of several lengths, docs/design/vision.md), held, and released into the generator
(exod.runner.vision.generator) with the others seen, once none is waiting to be seen or being
read (`expect`) or a prompt batch's worth is held: put in at once, a burst's first request was
prefilled alone and the others in later batches. While nothing decodes and no prompt batch has
begun, a step sees the next request and the generator waits (`gathering`), so requests that
came together decode from the same step. Each step is one bounded unit of work, so a cancel or
a stop is seen between any two. A group's other ranks are told of a request when rank 0 puts it
into its generator (`shipped`). The prompt cache: exod.runner.vision.cache; sampling and
logprobs: exod.runner.vision.sampling. The stages: docs/design/vision.md, "Interface".
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import LRUPromptCache

from exod.wire import messages as m
from exod.wire.options import GrammarLimits
from exod.core import memory
from exod.runner.link.log import ERR, log
from exod.runner.serving.loop import NoPromptCache
from exod.runner.serving import model_checks, tool_calls
from exod.runner.serving.cache_key import prompt_key
from exod.runner.serving.grammar import Grammars
from exod.runner.serving.logprobs import TokenText, entries
from exod.runner.serving.detokenize import streaming
from exod.runner.serving.output import Output
from exod.runner.serving.prepare import check_request, read_prompt
from exod.runner.serving.reading import Prompt
from exod.runner.serving.token_events import done, show_token
from exod.runner.vision.cache import KeptPrompts, placeholders
from exod.runner.vision.features import FeatureCache
from exod.runner.vision.generator import Generator
from exod.runner.vision.images import PictureBudget, fit_of
from exod.runner.vision.prompt import PictureDecoding, Seen, read_seen
from exod.runner.vision.request import Request, Shipped
from exod.runner.vision.sampling import last_processor

MIN_CHUNK = 32  # as exod.runner.serving.batch_engine
PREFILL_BATCH = 8
# What get_input_embeddings returns that the language model does not read, and that cannot be
# stacked over prompts of several lengths (Gemma 3's 4-D mask).
NOT_FOR_THE_LANGUAGE_MODEL = ("attention_mask_4d",)


class VisionEngine(KeptPrompts, NoPromptCache):  # KeptPrompts' cache first: it keeps one
    def __init__(self, model: Any, processor: Any, tokenizer: Any, *, width: int,
                 prefill_step: int = 256, grammar_limits: GrammarLimits | None = None,
                 feature_bytes: int = 256 << 20, cache_bytes: int = 0,
                 on_new_generator: Callable[[], None] | None = None,
                 language_model: Any = None, picture_bytes: int | None = None) -> None:
        """`tokenizer`: mlx-lm's wrapper of the model's tokenizer (detokenizer, end tokens,
        tool-call and think markers, as the text runner has them). `on_new_generator`: called
        after each generator is made (it sets Metal's wired limit as it is made; the instance's
        own setting goes back on after it, as in exod.runner.serving.batch_engine).
        `language_model`: what the generator calls in place of the model's own (a group's rank:
        exod.runner.group.group_model.GroupModel over it). `picture_bytes`: the pictures it
        holds at the model's resolution at once (exod.core.memory.picture_budget)."""
        self._on_new_generator = on_new_generator
        self.model, self.processor, self.tokenizer = model, processor, tokenizer
        self.language_model = language_model if language_model is not None \
            else model.language_model
        self.width = max(1, width)
        self.prefill_step = max(MIN_CHUNK, prefill_step)
        self.vocab, self.window = sizes(model, tokenizer)
        self.grammars = Grammars(tokenizer, self.vocab, grammar_limits or GrammarLimits())
        self.features = FeatureCache(model, feature_bytes)
        self.pictures = PictureDecoding(fit_of(processor), PictureBudget(
            picture_bytes if picture_bytes is not None else memory.picture_budget(None)))
        self.text = TokenText(tokenizer)
        self.placeholders = placeholders(model.config)
        self.cache_bytes = max(0, cache_bytes)
        # Qwen3-VL adds its tower's early features into the first layers (deepstack): mlx-vlm
        # 0.7's generator keeps one prompt's of them for a whole prompt batch (a list, which it
        # does not split by row), so such prompts are prefilled one at a time (decoding still
        # batches them).
        vision = getattr(model.config, "vision_config", None)
        self.prefill_alone = bool(getattr(vision, "deepstack_visual_indexes", None))
        self._cache = LRUPromptCache(max_size=1 << 30, max_bytes=self.cache_bytes)
        self.cache_lookups = self.cache_hits = self.cached_tokens = 0
        self._waiting: dict[str, Request] = {}  # admitted, not seen yet: in arrival order
        self._held: dict[str, Request] = {}  # seen, not in the generator yet: in arrival order
        self.reading = 0  # requests the serve loop is reading, to be admitted soon (`expect`)
        self._by_uid: dict[int, Request] = {}
        self._by_rid: dict[str, Request] = {}
        self._ended: dict[int, Request] = {}  # left the batch: their caches to store
        self._gen = self._new_generator()
        self.prompt_tokens = 0
        self.failed_steps = 0  # a group must not go on after one (exod.runner.group.lockstep)
        # What the requests put into the generator give a group's ranks, until taken: kept only
        # on rank 0 of a group (`leads`, set by its VisionLeader, whose every step takes them),
        # never on a runner alone, where nothing would take them.
        self.leads = False
        self.shipped: list[Shipped] = []

    def _new_generator(self) -> Generator:
        gen = Generator(
            self.language_model, self.processor,
            stop_tokens={int(t) for t in self.tokenizer.eos_token_ids},
            # Room for a whole prompt batch beside a full decoding batch: mlx-vlm's generator
            # starts prompts only while that many slots are free, so with room for `width`
            # alone, a request would wait for the whole batch to end. The daemon sends
            # `width` requests at most: that bounds the batch.
            completion_batch_size=self.width + PREFILL_BATCH,
            prefill_batch_size=1 if self.prefill_alone else min(self.width, PREFILL_BATCH),
            prefill_step_size=self.prefill_step, keeps=lambda uid: self.cache_bytes > 0,
            # The generator's own logprobs are never read (a request's come from its last
            # processor): computing them cost a gather and a list per step.
            compute_logprobs=False)
        if self._on_new_generator is not None:
            self._on_new_generator()
        return gen

    # ---- the interface the serve loop uses ------------------------------------------------
    @property
    def active(self) -> int:
        return len(self._waiting) + len(self._held) + len(self._by_rid)

    def read(self, req: m.Generate) -> Prompt:
        return read_seen(self.processor, self.model.config, self.tokenizer, req, self.vocab,
                         self.window, self.grammars, self.pictures)

    def admit(self, req: m.Generate, prompt: Prompt) -> None:
        if not isinstance(prompt, Seen):
            raise TypeError("a model that sees takes prompts read by its own engine")
        checked = check_request(self.tokenizer, req, self.vocab, self.window, prompt,
                                self.grammars)
        processors = list(checked.processors)
        rows: deque[mx.array] | None = deque() if checked.top_logprobs is not None else None
        sampler = None if model_checks.greedy_temperature(req.temperature) else checked.sampler
        if sampler is not None or rows is not None:
            processors.append(last_processor(sampler, rows))
        out = Output(streaming(self.tokenizer.detokenizer), req.stop, checked.markers,
                     checked.thinking)
        calls = tool_calls.splitter(self.tokenizer, req, checked.args_check, checked.prompt)
        self._waiting[req.id] = Request(req.id, req, prompt, checked, processors, out, calls,
                                         rows=rows)

    def cancel(self, rid: str) -> None:
        if self._waiting.pop(rid, None) is not None or self._held.pop(rid, None) is not None:
            return
        r = self._by_rid.get(rid)
        if r is not None:
            self._gen.remove(r.uid)
            self._forget(r)
            self._store_kept()

    def expect(self, reading: int) -> bool:
        """`reading` requests are being read by the serve loop, to be admitted soon: the
        requests seen are held for them (`release`). True when there is nothing else to do
        meanwhile (nothing to see, nothing in the generator): the loop then waits for them
        rather than step."""
        self.reading = reading
        return bool(reading) and not self._waiting and not self._by_uid

    def step(self) -> list[m.Event]:
        events = self.release() + self.see_next()
        if self.gathering:
            return events
        return events + self.advance()

    @property
    def gathering(self) -> bool:
        """Whether the next step sees another waiting request without stepping the generator:
        nothing decodes (no stream waits for a token) and no prompt batch has begun, so the
        requests that came together start in one prompt batch, prefilled together and decoding
        from the same step, rather than one batch each, each joining the decoding batch steps
        after the one before (an 8-request burst: 43 steps of 32 tokens each, 36 gathered).
        Each step still sees one request: a stop or a cancel is seen between any two."""
        return bool(self._waiting) and not self._gen.decoding and not self._gen.begun

    def see_next(self) -> list[m.Event]:
        """The first waiting request through the vision tower; held until `release`."""
        if not self._waiting:
            return []
        r = next(iter(self._waiting.values()))
        del self._waiting[r.rid]
        try:
            r.features = self._embed(r.seen)
        except Exception as e:  # noqa: BLE001 -- a family's tower or merge refusing the input
            log(f"seeing {r.rid} failed: {type(e).__name__}: {e}", ERR)
            return [m.Error(r.rid, "internal", f"{type(e).__name__}: {e}")]
        finally:
            r.seen.let_go()  # its pictures' arrays, for the rest of its life
        self._held[r.rid] = r
        return [m.Prefill(r.rid, 0, r.prompt_tokens)]

    def release(self) -> list[m.Event]:
        """The requests seen into the generator, together, once no other is waiting to be seen
        or being read (or a prompt batch's worth is held): one prompt batch for a burst. Called
        before a step sees the next request, so what the loop took meanwhile counts."""
        if not self._held or ((self._waiting or self.reading)
                              and len(self._held) < self._gen.prefill_batch_size):
            return []
        held, self._held = list(self._held.values()), {}
        events: list[m.Event] = []
        for r in held:
            assert r.features is not None
            # Others prefilled beside it: a short hit of the prompt cache is declined.
            crowded = len(held) > 1 or bool(self._waiting or self.reading
                                             or self._gen.to_prefill)
            events += self._insert(r, r.features, crowded=crowded)
        return events

    def advance(self) -> list[m.Event]:
        """One step of the generator: a decode step for the batch, a chunk of prompts."""
        events: list[m.Event] = []
        if not self._by_uid:
            return events
        prefilling = [r for r in self._by_uid.values() if r.prefilling]
        if prefilling:  # the chunk is shared by the prompts prefilled together
            together = max(1, min(len(prefilling), self._gen.prefill_batch_size))
            self._gen.prefill_step_size = max(MIN_CHUNK, self.prefill_step // together)
        try:
            _, responses = self._gen.next()
        except Exception as e:  # noqa: BLE001 -- mlx raises many types; the batch is unusable
            log(f"batch step failed: {type(e).__name__}: {e}", ERR)
            self.failed_steps += 1
            failed: list[m.Event] = [m.Error(r.rid, "internal", f"{type(e).__name__}: {e}")
                                     for r in self._by_uid.values()]
            self._by_uid.clear()
            self._by_rid.clear()
            self._ended.clear()
            self._gen = self._new_generator()
            return events + failed
        for resp in responses:
            r = self._by_uid.get(resp.uid)
            if r is not None:
                events += self._on_token(r, resp)
        self._store_kept()
        for r in prefilling:  # progress before the first token, for the hang watch
            if r.prefilling and r.uid in self._by_uid:
                r.prefilled = min(r.prompt_tokens, r.prefilled + self.prefill_step)
                events.append(m.Prefill(r.rid, r.prefilled, r.prompt_tokens))
        return events

    def abort_all(self, code: m.ErrorCode, message: str) -> list[m.Event]:
        rids = [*self._waiting, *self._held, *self._by_rid]
        for rid in rids:
            self.cancel(rid)
        return [m.Error(rid, code, message) for rid in rids]

    def abort_prefilling(self, code: m.ErrorCode, message: str) -> list[m.Event]:
        rids = [*self._waiting, *self._held,
                *(r.rid for r in self._by_rid.values() if r.prefilling)]
        for rid in rids:
            self.cancel(rid)
        return [m.Error(rid, code, message) for rid in rids]

    # ---- a group's other ranks (exod.runner.vision.group) ------------------------------------
    def request(self, rid: str) -> m.Generate:
        """A request in the generator, as admitted."""
        return self._by_rid[rid].req

    def see_shipped(self, req: m.Generate, tokens: list[int], pictures: list[str],
                    width: int, dtype: str, features: dict[str, mx.array],
                    cached: int) -> None:
        """A request as rank 0 saw it (`Shipped`), on a rank that has no vision tower: its
        embeddings are zeros of their shape (the previous rank's hidden state replaces them)
        and its features rank 0's; from the prompt cache only if rank 0 took a hit (`cached`
        tokens: whether a short hit is taken depends on requests only rank 0 has). RuntimeError
        when it cannot go into the generator."""
        read = read_prompt(self.tokenizer, req, self.vocab, self.window, self.grammars,
                           tokens=tokens)
        seen = Seen(read.tokens, read.max_tokens, read.constraint, read.args_check,
                    keys=tuple(pictures))
        self.admit(req, seen)
        given = {"inputs_embeds": mx.zeros((1, len(tokens), width), getattr(mx, dtype)),
                 **features}
        events = self._insert(self._waiting.pop(req.id), given, cold=not cached)
        if any(isinstance(ev, m.Error) for ev in events):
            self.failed_steps += 1
            raise RuntimeError(f"request {req.id} could not go into the generator")

    def serving(self) -> m.ServingReport:
        return m.ServingReport(batching="continuous", width=self.width, active=self.active,
                         prefill_step=self.prefill_step, cache_max_bytes=self.cache_bytes,
                         cache_entries=len(self._cache), cache_bytes=int(self._cache.nbytes),
                         cache_lookups=self.cache_lookups, cache_hits=self.cache_hits,
                         cached_tokens=self.cached_tokens, prompt_tokens=self.prompt_tokens)

    # ---- inside ----------------------------------------------------------------------------
    def _insert(self, r: Request, features: dict[str, Any], cold: bool = False,
                crowded: bool = False) -> list[m.Event]:
        """A request seen (`features`: its embeddings and what else the language model reads)
        into the generator, from the prompt cache where it holds the prompt's start (never when
        `cold`; a short hit declined when `crowded`), recorded for a group's ranks when it
        `leads` them."""
        r.features = None
        tokens = list(r.seen.tokens)
        try:
            r.key = prompt_key(tokens, self.placeholders, r.seen.keys)
            cache, cached = (None, 0) if cold else self._lookup(r.key, crowded, tokens)
            if cache is None:
                (uid,) = self._gen.insert([tokens], max_tokens=[r.checked.max_tokens],
                                          prompt_kwargs=[features],
                                          logits_processors=[r.processors])
            else:
                uid = self._gen.insert_warm(tokens, cached, cache, r.checked.max_tokens,
                                            features, r.processors)
        except Exception as e:  # noqa: BLE001 -- the generator refusing the input
            log(f"starting {r.rid} failed: {type(e).__name__}: {e}", ERR)
            return [m.Error(r.rid, "internal", f"{type(e).__name__}: {e}")]
        r.uid, r.cached_tokens, r.prefilled = uid, cached, cached
        self._by_uid[uid] = self._by_rid[r.rid] = r
        if self.leads:
            self.shipped.append(Shipped(r.rid, tokens, list(r.seen.keys), features, cached))
        self.prompt_tokens += r.prompt_tokens
        return [m.Prefill(r.rid, cached, r.prompt_tokens)]

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

    def _forget(self, r: Request) -> None:
        self._by_uid.pop(r.uid, None)
        self._by_rid.pop(r.rid, None)
        self._ended[r.uid] = r  # until its cache is stored

    def _on_token(self, r: Request, resp: Any) -> list[m.Event]:
        r.prefilling = False
        r.completion_tokens += 1
        r.generated.append(resp.token)
        entry = None
        if r.rows is not None:
            row = r.rows.popleft()
            entry = entries([row], [resp.token], [r.checked.top_logprobs or 0], self.text)[0]
        shown = show_token(r.rid, r.out, r.calls, resp.token, entry, resp.finish_reason,
                           r.completion_tokens)
        if shown.early:  # a stop sequence or the one call wanted: it leaves the batch now
            self._gen.remove(r.uid)
        if shown.reason is None:
            return shown.events
        self._forget(r)
        return [*shown.events, done(r.rid, shown.reason, r.out, r.calls, r.prompt_tokens,
                                    r.completion_tokens, r.cached_tokens)]


def sizes(model: Any, tokenizer: Any) -> tuple[int, int | None]:
    """The model's vocabulary (rows of the logits) and context window (None: unknown)."""
    text_args = SimpleNamespace(args=model.config.text_config)
    return (model_checks.model_vocab(text_args) or len(tokenizer),
            model_checks.context_window(text_args))
