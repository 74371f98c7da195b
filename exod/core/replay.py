"""Refusing an announcement seen before: the time window and the nonces within it.

A signed record carries its sender's wall-clock time and a random nonce. One is taken only when
its time is within `window` of this node's clock and its nonce has not been seen within the
window; a nonce is kept until its record's time leaves the window, after which the time alone
refuses it. So what is kept is bounded by what genuine nodes send in one window. Pure: the
caller gives the time.
"""

from __future__ import annotations

import heapq


class ReplayGuard:
    def __init__(self, window: float) -> None:
        self.window = window
        self._seen: set[str] = set()
        self._expiry: list[tuple[float, str]] = []  # (record time + window, nonce), a heap

    def check(self, sent: float, nonce: str, now: float) -> tuple[str, str] | None:
        """(kind, why) the record (sent at `sent`, wall clock) is refused, or None: then its
        nonce is remembered, so the same record a second time is refused."""
        self._forget(now)
        if sent > now + self.window:
            return "clock", (f"its time is {sent - now:.0f}s ahead of this node's clock (more "
                             f"than {self.window:g}s: set the clocks by NTP)")
        if sent < now - self.window:
            return "clock", (f"its time is {now - sent:.0f}s old (more than {self.window:g}s: "
                             "a replay, or a clock that needs NTP)")
        if nonce in self._seen:
            return "replayed", "replayed: its nonce was seen before"
        self._seen.add(nonce)
        heapq.heappush(self._expiry, (sent + self.window, nonce))
        return None

    def _forget(self, now: float) -> None:
        while self._expiry and self._expiry[0][0] < now:
            _, nonce = heapq.heappop(self._expiry)
            self._seen.discard(nonce)

    def __len__(self) -> int:
        return len(self._seen)
