"""One generation request as its key's usage sees it: let in by the key's limits once, when it
arrives (exod.core.usage.gate); its tokens spent as the runner reports them (the prompt's once
the runner has read it, the completion's as they come, Done's exact counts last); and its record
written to the usage log, on disk before the answer's end is sent (`finish`), so a request a
client saw end is never missing from the log. count_tokens (`counts` false) is limited like any
request, and neither spends nor is recorded."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from exod.api.errors import ApiError
from exod.api.limit_errors import limited
from exod.core.keys import ApiKey
from exod.core.usage.gate import Kind, Limited
from exod.core.usage.record import UsageRecord
from exod.daemon.usage.keeper import UsageKeeper
from exod.wire import messages as m


class Account:
    def __init__(self, keeper: UsageKeeper, key: ApiKey, dialect: str, model: str,
                 counts: bool = True) -> None:
        self.keeper, self.key = keeper, key
        self.dialect, self.model, self.counts = dialect, model, counts
        self.arrived = time.monotonic()
        self.instance: str | None = None  # the instance the daemon admitted it to
        self.prompt = self.cached = self.completion = 0
        self._first: float | None = None  # the runner's first word on it
        self._last: float | None = None  # its end, at the runner
        self._in = False
        self._done = False

    def admit(self) -> None:
        """Let the request in by its key's limits; raises exod.core.usage.gate.Limited."""
        self.keeper.gate.admit(self.key, time.monotonic(), time.time())
        self._in = True

    def event(self, ev: m.Event) -> None:
        now = time.monotonic()
        if self._first is None:
            self._first = now
        if isinstance(ev, m.Prefill) and ev.total and not self.prompt:
            self._spend("prompt", ev.total, now)
        elif isinstance(ev, (m.Text, m.Held)):
            self._spend("completion", 1, now)
        elif isinstance(ev, m.Done):
            self._spend("prompt", max(0, ev.prompt_tokens) - self.prompt, now)
            self._spend("completion", max(0, ev.completion_tokens) - self.completion, now)
            self.cached = max(0, ev.cached_tokens)
            self._last = now
        elif isinstance(ev, m.Error):
            self._last = now

    def _spend(self, kind: Kind, tokens: int, now: float) -> None:
        if tokens <= 0 or not self.counts:
            return
        if kind == "prompt":
            self.prompt += tokens
        else:
            self.completion += tokens
        self.keeper.gate.spend(self.key, kind, tokens, now, time.time())

    async def finish(self, status: int) -> None:
        """The request ended with `status`: out of flight, and recorded (once; a request the
        daemon found no instance for is not)."""
        if self._done:
            return
        self._done = True
        if self._in:
            self.keeper.gate.leave(self.key.name)
        if self.instance is None or not self.counts:
            return
        now = time.monotonic()
        end = self._last if self._last is not None else now
        batch = end - self._first if self._first is not None else 0.0
        await self.keeper.record(UsageRecord(
            time=time.time(), key=self.key.name, instance=self.instance, model=self.model,
            dialect=self.dialect, status=status, prompt_tokens=self.prompt,
            cached_tokens=self.cached, completion_tokens=self.completion,
            batch_seconds=max(0.0, batch), duration_seconds=now - self.arrived))


@dataclass
class Ended:
    """How an accounted request ended: the status its record says. 499 until the caller sets
    the answer's: the client left."""

    status: int = 499


@contextlib.asynccontextmanager
async def accounted(account: Account) -> AsyncIterator[Ended]:
    """Serve a request within its key's limits: let in (a refusal raises the dialect's 429 or
    529), then recorded once it ends, with the caller's status, an ApiError's, or 500 for any
    other failure."""
    outcome = Ended()
    try:
        try:
            account.admit()
        except Limited as e:
            raise limited(e, time.time()) from None
        yield outcome
    except ApiError as e:
        outcome.status = e.status
        raise
    except Exception:
        outcome.status = 500
        raise
    finally:
        await account.finish(outcome.status)
