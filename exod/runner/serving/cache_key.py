"""The key a prompt's KV cache is stored and looked up under: one derivation for every engine and
every tier of the prompt cache (RAM now, disk later), so that what one stores another finds.

For text the key is the token ids themselves. A prompt that shows pictures has the same
placeholder ids for every picture (Qwen's `<|image_pad|>` x N), so its key replaces each
picture's placeholders with ids derived from the picture's SHA-256: two pictures never share a
prefix past their first placeholder, and the next turn about the same picture shares all of it.
Derived ids are negative, so they never equal a token id. Pure: no mlx.

Which placeholders are whose: the i-th run of consecutive placeholder ids is the i-th picture
when there are as many runs as pictures (families that frame each picture with markers that are
not placeholders: Qwen's vision_start/end, Gemma's start/end_of_image). Otherwise (two pictures
side by side in one run, or one picture split into tiles, each its own run), every placeholder
gets an id derived from all the prompt's pictures together: a prefix is then shared only up to
the first picture unless every picture is the same, never wrongly.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence

__all__ = ["prompt_key", "picture_id"]

_BITS = 62  # of a SHA-256, per derived id: collisions are out of reach, and it stays an int64


def picture_id(*digests: str) -> int:
    """The (negative) id that stands for the pictures of these SHA-256 hex digests, in order."""
    joined = digests[0] if len(digests) == 1 else hashlib.sha256(
        "".join(digests).encode("ascii")).hexdigest()
    return -1 - (int(joined, 16) >> (256 - _BITS))


def runs(tokens: Sequence[int], placeholders: Collection[int]) -> list[tuple[int, int]]:
    """(start, end) of each run of consecutive placeholder ids."""
    out: list[tuple[int, int]] = []
    start = None
    for i, t in enumerate(tokens):
        if t in placeholders:
            if start is None:
                start = i
        elif start is not None:
            out.append((start, i))
            start = None
    if start is not None:
        out.append((start, len(tokens)))
    return out


def prompt_key(tokens: Sequence[int], placeholders: Collection[int] = (),
               pictures: Sequence[str] = ()) -> list[int]:
    """The cache key of a prompt: `tokens`, with the placeholder ids of `pictures` (their
    SHA-256 hex digests, in the order the prompt shows them) replaced (see the module)."""
    key = list(tokens)
    if not pictures:
        return key
    found = runs(tokens, placeholders)
    if len(found) == len(pictures):
        for (start, end), digest in zip(found, pictures, strict=True):
            key[start:end] = [picture_id(digest)] * (end - start)
    else:
        every = picture_id(*pictures)
        for start, end in found:
            key[start:end] = [every] * (end - start)
    return key
