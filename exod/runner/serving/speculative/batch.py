"""The rows being decoded, with a draft: what mlx-lm's GenerationBatch is to its BatchGenerator
(the same methods, which the generator calls), one speculative step a `next()`.

A step, for every row at once: the draft reads each row's last two tokens (it is one token
behind the model, so that a row which kept all its drafts and one which kept none read alike),
then drafts k tokens greedily, one forward each; the model reads each row's last token and its
k drafts in one forward and samples every position; each row keeps what mlx-lm's rule keeps
(exod.runner.serving.speculative.accept), and rows rewind by their own counts
(exod.runner.serving.speculative.rewind). A row that cannot speculate exactly (a grammar,
logits processors, a seed: see the package) reads its drafts all the same and keeps none: it
gets one token a step, its own sampler's and grammar's, as without a draft. A speculating row's
stateless logits processors (a logit bias, penalties) see each drafted prefix, as in mlx-lm's
speculative_generate_step.

Position 0 of every row is sampled by the rows' samplers as mlx-lm's batch samples them (one
call when they share one: the engine's batch sampler, which applies grammars); the later
positions of a speculating row by its own sampler (greedy: one argmax for the batch).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, cast

import mlx.core as mx
from mlx_lm.generate import GenerationBatch
from mlx_lm.models.cache import TokenBuffer
from mlx_lm.sample_utils import greedy_sampler

from exod.runner.serving.speculative.accept import judge
from exod.runner.serving.speculative.pair import Drafted
from exod.runner.serving.speculative.rewind import drop_last, rewind

Response = GenerationBatch.Response


@dataclass
class _Decoding:
    prev: int  # read by the model, not yet by the draft
    last: int  # the last token emitted (or to emit, while `first` is set): read by neither
    first: mx.array | None  # `last`'s logprobs while it waits to be emitted (a new row's)
    own: Any  # its own sampler (the one the batch's sampler runs for it)
    speculates: bool
    context: TokenBuffer | None  # what its logits processors see, if it has any
    matcher: Any  # its stop sequences' (mlx-lm's StopSequences.Matcher)
    emitted: int = 0


def own_sampler(sampler: Any, uid: int, processors: Any) -> tuple[Any, bool]:
    """A row's own sampler, and whether the row may speculate: not with a grammar (the engine's
    batch sampler holds it, `own`, or it is a processor), a logits processor that keeps a state
    (a thinking budget: it would count drafts that are rejected; a stateless one, a logit bias
    or a penalty, sees each drafted prefix as mlx-lm's speculative step shows it), or a seed
    (its promise is mlx-lm's draws after mx.random.seed, one a token)."""
    own = getattr(sampler, "own", None)
    mine, grammar = own(uid) if own is not None else (sampler, None)
    stateless = all(getattr(p, "stateless", False) for p in processors)
    return mine, grammar is None and stateless and not getattr(mine, "seeded", False)


class SpeculativeBatch:
    def __init__(self, pair: Drafted) -> None:
        self.pair = pair
        self.uids: list[int] = []
        self.prompt_cache: list[Any] = []  # the model's layers, then the draft's
        self.tokens: list[list[int]] = []  # what the caches hold of each row (the draft's)
        self.samplers: list[Any] = []
        self.logits_processors: list[Any] = []
        self.max_tokens: list[int] = []
        self._rows: list[_Decoding] = []

    @classmethod
    def start(cls, pair: Drafted, uids: list[int], last: list[int], cache: list[Any],
              tokens: list[list[int]], samplers: list[Any], processors: list[Any],
              stop_sequences: list[Any], max_tokens: list[int]) -> SpeculativeBatch:
        """Rows whose prompts have been read but for their last token: the model reads it
        (not the draft, which stays one behind) and samples each row's first token."""
        b = cls(pair)
        b.uids, b.prompt_cache, b.tokens = list(uids), cache, [list(t) for t in tokens]
        b.samplers, b.logits_processors = list(samplers), list(processors)
        b.max_tokens = list(max_tokens)
        if not uids:
            return b
        contexts = [TokenBuffer(t) if p else None for t, p in zip(tokens, processors, strict=True)]
        read = mx.array(last, dtype=mx.uint32)
        ours, _ = pair.parts(cache)
        logits = pair.model(read[:, None], cache=ours)[:, -1, :]
        chosen, logprobs = b._sample(logits, read, contexts)
        mx.eval(chosen, logprobs)
        for e, (uid, token) in enumerate(zip(uids, _ints(chosen), strict=True)):
            mine, speculates = own_sampler(samplers[e], uid, processors[e])
            b._rows.append(_Decoding(last[e], token, logprobs[e], mine, speculates, contexts[e],
                                stop_sequences[e].matcher()))
        return b

    def __len__(self) -> int:
        return len(self.uids)

    # ---- a step --------------------------------------------------------------------------
    def next(self) -> list[Any]:
        """One speculative step of every row: each row's tokens, in order, as mlx-lm's
        GenerationBatch.Response (several a row); a row that ends leaves the batch."""
        if not self.uids:
            return []
        rows, draft = self._rows, self.pair.draft
        k = draft.tokens if any(r.speculates for r in rows) else 0
        ours, theirs = self.pair.parts(self.prompt_cache)
        pairs = mx.array([[r.prev, r.last] for r in rows], dtype=mx.uint32)
        drafts = self._draft(pairs, theirs, k)
        read = mx.concatenate([pairs[:, 1:], drafts], axis=1)  # (B, k+1)
        logits = self.pair.model(read, cache=ours)
        chosen, first = self._sample(logits[:, 0, :], read[:, 0], [r.context for r in rows])
        later, later_lp = self._sample_later(logits[:, 1:, :], read)  # (B, 0) when k is 0
        mx.eval(chosen, drafts, later,
                *([] if k else [[c.state for c in theirs]]))  # a draft read nothing reads
        samples, proposed, rest = _ints(chosen), _rows(drafts), _rows(later)

        out: list[Any] = []
        ended: list[tuple[int, int, str]] = []  # (row, its last response's place, why)
        drops: list[int] = []
        for e, r in enumerate(rows):
            v = judge(proposed[e], [samples[e], *rest[e]], speculates=r.speculates,
                      fresh=r.last if r.first is not None else None,
                      finish=partial(self._finish, e, r))
            if r.speculates:
                draft.drafted += k
                draft.accepted += v.accepted
            for token, at in zip(v.tokens, v.positions, strict=True):
                lp = later_lp[e, at - 1] if at > 0 else first[e] if at == 0 or r.first is None \
                    else r.first
                out.append(Response(self.uids[e], token, lp, None, None, None))
            if v.finish is not None:
                ended.append((e, len(out) - 1, v.finish))
            drops.append(k + 1 - v.keep)
            fed = [r.prev, r.last, *proposed[e]]  # what the draft read: it is one behind
            self.tokens[e] += fed[:v.keep]
            if r.context is not None and v.keep > 1:  # the drafts kept, after the last token
                r.context.update_and_fetch(mx.array(fed[2:v.keep + 1], dtype=mx.uint32))
            if v.keep:
                r.prev = fed[v.keep]
            r.last, r.first = v.tokens[-1], None
        rewind(self.prompt_cache, drops)
        for e, at, why in ended:  # its cache as it stands once rewound
            out[at] = Response(self.uids[e], out[at].token, out[at].logprobs, why,
                               self.extract_cache(e), self.tokens[e])
        if ended:
            gone = {e for e, _, _ in ended}
            self.filter([e for e in range(len(rows)) if e not in gone])
        return out

    def _finish(self, e: int, r: _Decoding, token: int) -> str | None:
        """mlx-lm's GenerationBatch's rule for each token: its length, then its stop tokens."""
        r.emitted += 1
        reason = "length" if r.emitted >= self.max_tokens[e] else None
        return "stop" if r.matcher.advance(token) else reason

    def _draft(self, pairs: mx.array, cache: list[Any], k: int) -> mx.array:
        """(B, k) draft tokens, greedy; the draft reads each row's last two tokens first."""
        model = self.pair.draft.model
        if not k:  # nobody speculates: the draft only keeps up, one token behind
            model(pairs[:, :1], cache=cache)
            return mx.zeros((pairs.shape[0], 0), dtype=mx.uint32)
        logits = model(pairs, cache=cache)
        out = [mx.argmax(logits[:, -1, :], axis=-1).astype(mx.uint32)]
        for _ in range(k - 1):
            mx.async_eval(out[-1])
            logits = model(out[-1][:, None], cache=cache)
            out.append(mx.argmax(logits[:, -1, :], axis=-1).astype(mx.uint32))
        return mx.stack(out, axis=1)

    def _sample(self, logits: mx.array, read: mx.array, contexts: list[TokenBuffer | None]
                ) -> tuple[mx.array, mx.array]:
        """The next token of every row, as mlx-lm's GenerationBatch samples it: each row's
        logits processors (over what it has read), the log-softmax, then its sampler."""
        if any(c is not None for c in contexts):
            parts = []
            for e, context in enumerate(contexts):
                part = logits[e:e + 1]
                if context is not None:
                    seen = context.update_and_fetch(read[e:e + 1])
                    for process in self.logits_processors[e]:
                        part = process(seen, part)
                parts.append(part)
            logits = mx.concatenate(parts, axis=0)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        samplers = self.samplers
        if all(s is samplers[0] for s in samplers):
            return samplers[0](logprobs), logprobs
        return mx.concatenate([s(logprobs[e:e + 1]) for e, s in enumerate(samplers)]), logprobs

    def _sample_later(self, logits: mx.array, read: mx.array) -> tuple[mx.array, mx.array]:
        """Positions 1..k of every row (B, k), by each speculating row's own sampler after its
        processors: greedy rows in one argmax; and every position's logprobs, which only rows
        that asked read."""
        if not logits.shape[1]:  # nobody speculates this step
            return mx.zeros(logits.shape[:2], dtype=mx.uint32), logits
        if any(r.speculates and r.context is not None for r in self._rows):
            logits = mx.concatenate([self._processed(e, r, logits[e], read[e])
                                     if r.speculates and r.context is not None
                                     else logits[e:e + 1] for e, r in enumerate(self._rows)])
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        chosen = mx.argmax(logits, axis=-1).astype(mx.uint32)
        drawn = [e for e, r in enumerate(self._rows)
                 if r.speculates and r.own is not greedy_sampler]
        if drawn:
            rows = [r.own(logprobs[e]).astype(mx.uint32) if e in drawn else chosen[e]
                    for e, r in enumerate(self._rows)]
            chosen = mx.stack(rows)
        return chosen, logprobs

    def _processed(self, e: int, r: _Decoding, logits: mx.array, read: mx.array) -> mx.array:
        """(1, k, V): row e's logits at positions 1..k, each through its processors over what
        comes before it: the row's tokens, its last token (position 0's) and the drafts."""
        assert r.context is not None
        seen = r.context.tokens
        parts = []
        for i in range(logits.shape[0]):
            part = logits[i:i + 1]
            prefix = mx.concatenate([seen, read[1:i + 2].astype(seen.dtype)])
            for process in self.logits_processors[e]:
                part = process(prefix, part)
            parts.append(part)
        return mx.concatenate(parts)[None]

    # ---- what BatchGenerator asks of its batch being decoded -----------------------------
    def extract_cache(self, idx: int) -> list[Any]:
        """Row `idx`'s caches, each holding `tokens[idx]` (the model's loses the one token it
        is ahead of the draft)."""
        ours, theirs = self.pair.parts(self.prompt_cache)
        return [drop_last(c.extract(idx)) for c in ours] + [c.extract(idx) for c in theirs]

    def extend(self, other: SpeculativeBatch) -> None:
        if not other.uids:
            return
        if not self.uids:
            self.prompt_cache = other.prompt_cache
        else:
            for mine, theirs in zip(self.prompt_cache, other.prompt_cache, strict=True):
                mine.extend(theirs)
        self.uids += other.uids
        self.tokens += other.tokens
        self.samplers += other.samplers
        self.logits_processors += other.logits_processors
        self.max_tokens += other.max_tokens
        self._rows += other._rows

    def filter(self, keep: list[int]) -> None:
        if not keep:
            self.prompt_cache = []
        else:
            for c in self.prompt_cache:
                c.filter(keep)
        for name in ("uids", "tokens", "samplers", "logits_processors", "max_tokens", "_rows"):
            old = getattr(self, name)
            setattr(self, name, [old[i] for i in keep])


def _ints(a: mx.array) -> list[int]:
    return cast("list[int]", a.tolist())


def _rows(a: mx.array) -> list[list[int]]:
    return cast("list[list[int]]", a.tolist())
