"""The batch engine's side of fair shares (exod.runner.serving.fair_share decides): before each
step, `batch` rows held back while interactive work waits or is in its prompt, then whom the
share picks started, or brought back, while the batch has room. A row held back leaves through
exod.runner.serving.holding; one being decoded first sends the token it had chosen."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from exod.runner.serving.batch_request import BatchRequest
from exod.runner.serving.fair_share import FairShare
from exod.runner.serving.holding import Ahead, can_hold, take_out
from exod.runner.serving.logprobs import TokenText, entries
from exod.wire import messages as m

# Into the batch: a cache holding these tokens, these fed through the model.
Put = Callable[[BatchRequest, "list[Any] | None", list[int], list[int]], None]
# A row's token, sent as a step's would be: its events (it may end there).
OnToken = Callable[[BatchRequest, Any, "m.TokenLogprob | None"], list[m.Event]]


class Turns:
    """`requests`: the engine's, by id (waiting, loading or in the batch); `rows`: those in the
    generator, by uid. `start`: a request's first start (its prompt looked up, or following
    another); `release`: the followers of one held back start on their own; `follows`: a
    request would follow a prompt in flight (exod.runner.serving.shared_prefix)."""

    def __init__(self, share: FairShare, requests: dict[str, BatchRequest],
                 rows: dict[int, BatchRequest], width: int, start: Callable[[BatchRequest], object],
                 put: Put, on_token: OnToken, release: Callable[[BatchRequest], None],
                 text: TokenText, eos: set[int],
                 follows: Callable[[BatchRequest], bool]) -> None:
        self.share, self.requests, self.rows, self.width = share, requests, rows, width
        self.start, self.put, self.on_token, self.release = start, put, on_token, release
        self.text, self.eos, self.follows = text, eos, follows

    def room(self, gen: Any, r: BatchRequest) -> bool:
        """A row is free for `r`, and a place among the prompts prefilled together, unless it
        follows a prompt in flight: started now, it starts at once (not behind others in
        mlx-lm's own queue), or waits for its leader there."""
        started = [q for q in self.requests.values() if not q.waiting]
        prompts = sum(q.prefilling and q.uid >= 0 for q in started)
        return len(started) < self.width and (
            prompts < gen.prefill_batch_size or (r.held is None and self.follows(r)))

    def before_step(self, gen: Any, holds: bool, drop_row: Callable[[int], None]
                    ) -> list[m.Event]:
        """`holds`: the engine can hold rows back (not while speculating)."""
        events: list[m.Event] = []
        prompts = {r.rid for r in self.requests.values() if r.prefilling and not r.waiting}
        if holds and can_hold(gen):
            rows = [r.rid for r in self.rows.values() if r.out is not None]
            while (pick := self.share.preempt(rows, prompts)) is not None:
                events += self._hold(gen, self.requests[pick], drop_row)
                rows.remove(pick)
                prompts.discard(pick)
        batch = not self.share.urgent(prompts)
        while (rid := self.share.next(batch)) is not None and \
                self.room(gen, r := self.requests[rid]):
            self.share.start(rid)
            r.waiting = False
            if r.held is None:
                self.start(r)
            else:
                held, r.held = r.held, None
                self.put(r, held.cache, held.tokens, held.feed)
        return events

    def _hold(self, gen: Any, r: BatchRequest, drop_row: Callable[[int], None]
              ) -> list[m.Event]:
        """`r` out of the batch until the fair share starts it again. A row being decoded
        sends the token it had chosen first (it may end there)."""
        self.release(r)
        held, ahead = take_out(gen, r.uid, r.prompt)
        drop_row(r.uid)
        self.rows.pop(r.uid, None)
        events: list[m.Event] = []
        if ahead is not None:
            token, logprobs = ahead
            reason = "stop" if token in self.eos else \
                "length" if r.completion_tokens + 1 >= r.limit else None
            entry = None if r.top_logprobs is None else \
                entries([logprobs], [token], [r.top_logprobs], self.text)[0]
            events = self.on_token(r, Ahead(r.uid, token, logprobs, reason, held.cache,
                                            held.tokens), entry)
            if r.rid not in self.requests:  # it ended there
                return events
            r.insert["max_tokens"] = [r.limit - r.completion_tokens]
        r.uid, r.held, r.waiting = -1, held, True
        self.share.hold(r.rid)
        return events
