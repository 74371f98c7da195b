"""Stop sequences over streamed text. Pure (no mlx), so it is unit-tested on its own.

Text is released as soon as it cannot be the start of a stop sequence: the tail that could
still grow into one is held back until the next piece of text decides it. A stop sequence may
span several tokens; the text before it is released and the text from it on never is.
"""

from __future__ import annotations


class StopMatcher:
    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self._held = ""  # text received but not yet released
        self.stopped = False
        self.matched: str | None = None  # the stop sequence that ended the text, once stopped

    def feed(self, text: str) -> str:
        """Add generated text; return what can be released now (may be "")."""
        if self.stopped:
            return ""
        held = self._held + text
        if not self.stops:
            self._held = ""
            return held
        hits = [(i, s) for i, s in ((held.find(s), s) for s in self.stops) if i >= 0]
        if hits:
            at, self.matched = min(hits, key=lambda h: h[0])
            self.stopped = True
            self._held = ""
            return held[:at]
        keep = self._partial_len(held)
        self._held = held[len(held) - keep :] if keep else ""
        return held[: len(held) - keep]

    def flush(self) -> str:
        """The generation ended without a stop sequence: release what was held."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _partial_len(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of a stop sequence."""
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best
