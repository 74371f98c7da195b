"""A streaming detokenizer that never holds text which can no longer change.

mlx-lm's byte-level BPE detokenizer (Qwen, Llama 3, SmolLM...) holds a token's text while the
text decoded so far ends in U+FFFD, waiting for the rest of a multi-byte character. Bytes that
no character can start with (a lone continuation byte, say) end in U+FFFD whatever comes next,
so after one of them it holds every later token too, until the generation ends: a stream
that shows nothing for its whole answer, then all of it at once (seen with the vision bench's
random-weight model, whose answers are sometimes runs of such bytes). Here what an incremental
UTF-8 decoder can already decide is released at once, U+FFFD for each byte that is not part of
a character, as mlx-vlm's server streams it; only a character's first bytes that may still be
completed are held. The text at the end is the same: decoding with replacement, piece by
piece, gives what decoding it whole gives.
"""

from __future__ import annotations

import codecs
from typing import Any

from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, _byte_decoder

SPACE = 32  # mlx-lm holds a lone space for a token, to drop it when it starts the answer


class ReleasingBPE(BPEStreamingDetokenizer):
    def add_token(self, token: int) -> None:
        super().add_token(token)
        held = self._unflushed
        v = self.tokenmap[token] if token < len(self.tokenmap) else ""
        if not held or (len(v) == 1 and _byte_decoder().get(v) == SPACE):
            return
        try:
            raw = bytes(_byte_decoder()[c] for c in held)
        except KeyError:  # a token outside the byte alphabet (added tokens): as mlx-lm does
            return
        dec = codecs.getincrementaldecoder("utf-8")("replace")
        out = dec.decode(raw)
        if not out:  # only the start of a character so far
            return
        pending = len(dec.getstate()[0])  # one alphabet character per byte
        self.text += self._maybe_trim_space(out)
        self._unflushed = held[len(held) - pending:] if pending else ""


def streaming(detokenizer: Any) -> Any:
    """`detokenizer` (a fresh one, from mlx-lm's tokenizer wrapper), releasing what it can:
    mlx-lm's BPE one becomes a ReleasingBPE; the others are kept as they are."""
    if type(detokenizer) is BPEStreamingDetokenizer:
        detokenizer.__class__ = ReleasingBPE
    return detokenizer
