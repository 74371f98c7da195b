"""Logprob entries (exod.wire.messages.TokenLogprob) for the tokens a step generated, for the
requests that asked.

The log-probabilities are the rows mlx-lm's generators return with each token: the model's
distribution after logit_bias and the penalties (the logits processors), before temperature and
the sampler's filters. The chosen token's entry is read from the very row it was sampled from.

A token's text is its own bytes (from the detokenizer's token map: byte-level BPE symbols,
SentencePiece pieces and `<0x..>` byte tokens), decoded with U+FFFD for a character it only
starts or ends; `bytes` carries them exactly.
"""

from __future__ import annotations

import functools
from typing import Any

import mlx.core as mx
import numpy as np

from exod.wire import messages as m
from exod.core import request_rules as rules

FLOOR = -9999.0  # a logprob of -inf (a token ruled out) as OpenAI reports it: JSON has no inf


@functools.cache
def _byte_symbols() -> dict[str, int]:
    """Byte-level BPE's printable stand-in for each byte value (GPT-2's scheme): printable
    Latin-1 bytes stand for themselves, the others are shifted past U+00FF in order."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    out = {chr(b): b for b in kept}
    shifted = 0
    for b in range(256):
        if b not in out.values():
            out[chr(256 + shifted)] = b
            shifted += 1
    return out


class TokenText:
    """A token id's (text, bytes), worked out once per id."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        detok = getattr(tokenizer, "_detokenizer", None)
        self.kind = type(detok).__name__
        self.tokenmap: list[Any] = list(getattr(detok, "tokenmap", None) or [])
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, token: int) -> tuple[str, list[int]]:
        got = self._cache.get(token)
        if got is None:
            raw = self._bytes(token)
            got = self._cache[token] = (raw.decode("utf-8", "replace"), list(raw))
        return got

    def _bytes(self, token: int) -> bytes:
        piece = self.tokenmap[token] if token < len(self.tokenmap) else None
        if isinstance(piece, bytes):  # SentencePiece: `▁` is a space
            return piece.replace("\u2581".encode(), b" ")
        if isinstance(piece, str) and self.kind == "BPEStreamingDetokenizer":
            symbols = _byte_symbols()
            if all(c in symbols for c in piece):
                return bytes(symbols[c] for c in piece)
            return piece.encode()
        return str(self.tokenizer.decode([token])).encode()


def entries(rows: list[mx.array], tokens: list[int], tops: list[int],
            text: TokenText) -> list[m.TokenLogprob]:
    """One entry per (row, token), with the row's `tops[i]` most probable tokens.

    In numpy, on rows mlx has already evaluated: an mlx operation here would be queued behind
    the next decode step, which the generator has already started, and wait for it, so the
    work that should overlap that step (detokenizing, sending) would follow it instead."""
    out = []
    for row, token, top in zip(rows, tokens, tops, strict=True):
        if row.dtype != mx.float32:  # numpy has no bfloat16: a conversion (which waits)
            row = row.astype(mx.float32)
        lp = np.asarray(row).reshape(-1)
        best: list[m.TopLogprob] = []
        k = min(top, rules.MAX_TOP_LOGPROBS, lp.size)
        if k > 0:
            ids = np.argpartition(lp, lp.size - k)[lp.size - k:]
            ids = ids[np.lexsort((ids, -lp[ids]))]  # ties: the lower id first, as argmax
            best = [_top(text, int(t), float(lp[t])) for t in ids]
        word, raw = text(token)
        out.append(m.TokenLogprob(word, _finite(float(lp[token])), raw, best))
    return out


def _top(text: TokenText, token: int, logprob: float) -> m.TopLogprob:
    word, raw = text(token)
    return m.TopLogprob(word, _finite(logprob), raw)


def _finite(x: float) -> float:
    return x if x > FLOOR else FLOOR
