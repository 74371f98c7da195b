"""What an image of a request may be, checked where it is cheap: its bytes on the wire here
(pure, both ends), its pixels in the runner before any is decoded (exod.runner.vision.images).

A `Generate` carries images as base64 text in its JSON frame (exod.messages.Image), and its
messages place them: a message's content is its text, or a list of parts, each
{"type": "text", "text": ...} or {"type": "image", "image": N} (N: the request's N-th image,
each image placed exactly once). `content_problem` checks that shape.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from exod.core.sizes import format_size

# Bytes of one image as sent (a 48-megapixel phone JPEG is 10-20 MB).
MAX_IMAGE_BYTES = 20 * 1024 * 1024
# Images of one request, and their bytes together: the frame that carries them (64 MiB,
# exod.protocol.MAX_FRAME) holds them in base64 (4/3 of the bytes) with room to spare.
MAX_IMAGES = 16
MAX_REQUEST_IMAGE_BYTES = 40 * 1024 * 1024
# Pixels of one image, read from its header before any is decoded: above this a picture is
# refused, however few bytes it takes (a 100-megapixel PNG of one colour is ~100 KB; a
# decompression bomb claims far more). A 48-megapixel photo passes.
MAX_PIXELS = 50_000_000


class ImageError(ValueError):
    """An image that cannot be served, with why (the caller names where it is)."""


def encoded_size_bound(n_bytes: int) -> int:
    """Characters of the base64 of `n_bytes` bytes."""
    return 4 * -(-n_bytes // 3)


def decode(data: str) -> bytes:
    """The bytes of one image's base64 text; ImageError when it is too big or not base64
    (checked on its length before anything is decoded)."""
    if len(data) > encoded_size_bound(MAX_IMAGE_BYTES):
        raise ImageError(f"larger than {format_size(MAX_IMAGE_BYTES)}")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError("not base64") from None
    if not raw:
        raise ImageError("empty")
    return raw


def content_problem(messages: list[dict[str, Any]], images: int) -> str | None:
    """Why the messages' contents do not place `images` images each exactly once, as text or
    parts (see the module's docstring), or None."""
    placed: list[int] = []
    for i, msg in enumerate(messages):
        content = msg.get("content")
        if isinstance(content, str):
            continue
        if not isinstance(content, list):
            return f"messages[{i}].content: neither text nor a list of parts"
        for j, part in enumerate(content):
            where = f"messages[{i}].content[{j}]"
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text" and set(part) == {"type", "text"} \
                    and isinstance(part["text"], str):
                continue
            if kind == "image" and set(part) == {"type", "image"}:
                n = part["image"]
                if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n < images:
                    return f"{where}.image: no image {n!r} in this request"
                placed.append(n)
                continue
            return f"{where}: not a text or image part"
    if sorted(placed) != list(range(images)):
        return "images: each image must be placed exactly once in the messages"
    return None


def text_of(content: Any) -> str:
    """A content's text, its image parts left out."""
    if isinstance(content, str):
        return content
    return "".join(p["text"] for p in content if p.get("type") == "text")


def first_image_part(messages: list[dict[str, Any]]) -> str | None:
    """Where the first image part of the messages is (`messages[i].content[j]`), or None."""
    for i, msg in enumerate(messages):
        content = msg.get("content")
        if isinstance(content, list):
            for j, part in enumerate(content):
                if isinstance(part, dict) and part.get("type") == "image":
                    return f"messages[{i}].content[{j}]"
    return None
