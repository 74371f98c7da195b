"""What an image of a request may be, checked where it is cheap: its bytes on the wire here
(pure, both ends); the pixels of a request's pictures together in the daemon, read from their
headers (`dimensions`, `pixel_problem`); each picture's pixels in the runner before any is
decoded (exod.runner.vision.images).

A `Generate` carries images as base64 text in its JSON frame (exod.wire.messages.Image), and its
messages place them: a message's content is its text, or a list of parts, each
{"type": "text", "text": ...} or {"type": "image", "image": N} (N: the request's N-th image,
each image placed exactly once). `content_problem` checks that shape.

Every dialect names its pictures its own way (chat completions' `image_url`, Anthropic's `image`
blocks, Responses' `input_image`, Ollama's `images`); each hands them to `Pictures`, which gives
the content part that places each one and keeps its `Source`: the bytes (a `data:` URL's, or a
block's base64) or an http(s) URL, which the daemon fetches before the request goes on
(exod.api.image_fetch), and where the client put it, for errors.
"""

from __future__ import annotations

import base64
import binascii
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from exod.core.request_rules.base import RequestError
from exod.core.sizes import format_size

# Bytes of one image as sent (a 48-megapixel phone JPEG is 10-20 MB).
MAX_IMAGE_BYTES = 20 * 1024 * 1024
# Images of one request, and their bytes together: the frame that carries them (64 MiB,
# exod.wire.protocol.MAX_FRAME) holds them in base64 (4/3 of the bytes) with room to spare.
MAX_IMAGES = 16
MAX_REQUEST_IMAGE_BYTES = 40 * 1024 * 1024
# Pixels of one image, read from its header before any is decoded: above this a picture is
# refused, however few bytes it takes (a 100-megapixel PNG of one colour is ~100 KB; a
# decompression bomb claims far more). A 48-megapixel photo passes.
MAX_PIXELS = 50_000_000
# Pixels of a request's pictures together (api.max_request_megapixels), read from their headers
# in the daemon before the request takes its place in a queue: each is decoded whole before it
# is reduced to the model's resolution (~0.1 s for 10 megapixels of PNG on one core), so this
# bounds the time a request's decoding takes (exod.runner.vision.images).
REQUEST_MEGAPIXELS = 100


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


def unseen(model: str | None, where: str) -> str:
    """The refusal of a picture by a model that does not see."""
    who = f"model {model!r}" if model else "this model"
    return f"`{where}`: {who} does not see images: it takes text only"


def text_of(content: Any) -> str:
    """A content's text, its image parts left out."""
    if isinstance(content, str):
        return content
    return "".join(p["text"] for p in content if p.get("type") == "text")


def first_image_part(messages: list[dict[str, Any]]) -> str | None:
    """Where the first image part of the messages is (`messages[i].content[j]`), or None."""
    return next(iter(image_parts(messages)), None)


# ---- what the dialects give: a picture's bytes or its URL ------------------------------------
SCHEMES = ("http://", "https://")
MAX_URL = 8192  # characters of an image's http(s) URL
# A data URL: `data:` [media type and parameters] `;base64,` payload (RFC 2397). Only base64:
# a picture in percent-encoded text is no picture a client sends.
_DATA_URL = re.compile(r"data:([^,;]*)((?:;[^,;]*)*?);base64,", re.IGNORECASE)


@dataclass(frozen=True)
class Source:
    """One picture of a request as a dialect gave it: its bytes as base64 (`data`) or an http(s)
    URL the daemon fetches (`url`); `where`: the client's own path to it, for errors."""

    where: str
    data: str | None = None
    url: str | None = None


def data_url(value: str, where: str) -> Source:
    """A `data:` URL's picture (its media type is not trusted: the runner reads the bytes)."""
    found = _DATA_URL.match(value)
    if found is None:
        raise RequestError(f"`{where}` must be a base64 data URL (data:image/png;base64,...) or "
                           "an http(s) URL", where)
    kind = found.group(1).strip().lower()
    if kind and not kind.startswith("image/"):
        raise RequestError(f"`{where}`: a data URL of {kind!r}, not of an image", where)
    return base64_data(value[found.end():], where)


def base64_data(value: Any, where: str) -> Source:
    """A picture's bytes as base64 text, its length checked (the runner decodes it)."""
    if not isinstance(value, str) or not value:
        raise RequestError(f"`{where}` must be the image's bytes in base64", where)
    if len(value) > encoded_size_bound(MAX_IMAGE_BYTES):
        raise RequestError(f"`{where}`: an image larger than {MAX_IMAGE_BYTES >> 20} MiB",
                           where)
    return Source(where, data=value)


def web_url(value: Any, where: str) -> Source:
    """An http(s) URL to fetch (where it points is checked when it is fetched)."""
    if not isinstance(value, str) or not value.lower().startswith(SCHEMES):
        raise RequestError(f"`{where}` must be an http(s) URL", where)
    if len(value) > MAX_URL:
        raise RequestError(f"`{where}` is longer than {MAX_URL} characters", where)
    return Source(where, url=value)


def image_url(value: Any, where: str) -> Source:
    """A URL as OpenAI's dialects give one: a `data:` URL, or an http(s) URL."""
    if not isinstance(value, str):
        raise RequestError(f"`{where}` must be a string (a data URL or an http(s) URL)", where)
    if value[:5].lower() == "data:":
        return data_url(value, where)
    return web_url(value, where)


class Pictures:
    """A request's pictures, in the order its dialect met them: each one `add`ed gives the
    content part that places it (see the module's docstring)."""

    def __init__(self) -> None:
        self.sources: list[Source] = []

    def add(self, source: Source) -> dict[str, Any]:
        if len(self.sources) >= MAX_IMAGES:
            raise RequestError(f"`{source.where}`: a request shows at most {MAX_IMAGES} images",
                               source.where)
        total = sum(len(s.data or "") for s in self.sources) + len(source.data or "")
        if total > encoded_size_bound(MAX_REQUEST_IMAGE_BYTES):
            raise RequestError(f"`{source.where}`: a request's images take at most "
                               f"{MAX_REQUEST_IMAGE_BYTES >> 20} MiB in all", source.where)
        self.sources.append(source)
        return {"type": "image", "image": len(self.sources) - 1}


def joined(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """A content of text and image parts (as `Pictures` gives them): its text joined when it
    shows no image (as a text model takes it), else the parts, adjacent texts joined."""
    if not any(p["type"] == "image" for p in parts):
        return "".join(p["text"] for p in parts)
    out: list[dict[str, Any]] = []
    for p in parts:
        if p["type"] == "text" and out and out[-1]["type"] == "text":
            out[-1] = {"type": "text", "text": out[-1]["text"] + p["text"]}
        elif p["type"] != "text" or p["text"]:
            out.append(p)
    return out


def image_parts(messages: list[dict[str, Any]]) -> list[str]:
    """Where each image part of the messages is (`messages[i].content[j]`), in order."""
    return [f"messages[{i}].content[{j}]" for i, msg in enumerate(messages)
            if isinstance(msg.get("content"), list)
            for j, part in enumerate(msg["content"])
            if isinstance(part, dict) and part.get("type") == "image"]


# ---- sizes from headers (the daemon's, before a request is queued) ---------------------------
class _Short(Exception):
    """The bytes end before the header says what it must."""


def dimensions(raw: bytes) -> tuple[int, int] | None:
    """A picture's width and height as its header says, as PIL reads them (a GIF's first frame
    may reach past its screen), from its first bytes; None when they do not say (not a PNG,
    JPEG, GIF or WebP, or cut short). Pure: no pixel is decoded."""
    try:
        if raw.startswith(b"\x89PNG\r\n\x1a\n"):
            if raw[12:16] != b"IHDR":
                return None
            return _need(raw, 24, ">II", 16)
        if raw.startswith(b"\xff\xd8"):
            return _jpeg(raw)
        if raw[:6] in (b"GIF87a", b"GIF89a"):
            return _gif(raw)
        if raw[:4] == b"RIFF" and raw[8:12] == b"WEBP":
            return _webp(raw)
    except _Short:
        return None
    return None


def _need(raw: bytes, end: int, fmt: str, at: int) -> Any:
    if len(raw) < end:
        raise _Short
    return struct.unpack_from(fmt, raw, at)


# JPEG's start-of-frame markers (each a coding: baseline, progressive, lossless, arithmetic...).
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def _jpeg(raw: bytes) -> tuple[int, int] | None:
    """The frame's size from the first start-of-frame segment. Bytes between segments that are
    no marker are skipped, as PIL skips them."""
    at = 2
    while True:
        if at + 2 > len(raw):
            raise _Short
        if raw[at] != 0xFF:
            at += 1
            continue
        marker = raw[at + 1]
        if marker == 0xFF:  # fill
            at += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # no length follows
            at += 2
            continue
        if marker in (0xD9, 0xDA):  # the end, or the scan before any frame
            return None
        (length,) = _need(raw, at + 4, ">H", at + 2)
        if marker in _SOF:
            height, width = _need(raw, at + 9, ">HH", at + 5)
            return width, height
        at += 2 + length


def _gif(raw: bytes) -> tuple[int, int] | None:
    """The screen's size, widened by the first frame's extent (as PIL's first frame)."""
    width, height, flags = _need(raw, 11, "<HHB", 6)
    at = 13 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0)
    while True:
        if at >= len(raw):
            raise _Short
        kind = raw[at]
        if kind == 0x21:  # an extension: a label, then sub-blocks up to an empty one
            at += 2
            while True:
                if at >= len(raw):
                    raise _Short
                if raw[at] == 0:
                    at += 1
                    break
                at += 1 + raw[at]
        elif kind == 0x2C:  # the first frame's descriptor
            x, y, w, h = _need(raw, at + 9, "<HHHH", at + 1)
            return max(width, x + w), max(height, y + h)
        else:
            return width, height


def _webp(raw: bytes) -> tuple[int, int] | None:
    """The canvas's size from the first chunk (lossy, lossless, or extended)."""
    chunk = raw[12:16]
    if chunk == b"VP8 ":
        if _need(raw, 26, "3s", 23)[0] != b"\x9d\x01\x2a":
            return None
        w, h = _need(raw, 30, "<HH", 26)
        return w & 0x3FFF, h & 0x3FFF
    if chunk == b"VP8L":
        if _need(raw, 21, "B", 20)[0] != 0x2F:
            return None
        (bits,) = _need(raw, 25, "<I", 21)
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X":
        w0, w1, w2, h0, h1, h2 = _need(raw, 30, "6B", 24)
        return (w0 | w1 << 8 | w2 << 16) + 1, (h0 | h1 << 8 | h2 << 16) + 1
    return None


# What of a picture's base64 is decoded to find its size: its first bytes (a PNG's, a GIF's and
# a WebP's size are in them, a JPEG's after its metadata: EXIF, ICC profile), then more.
HEAD_BYTES = (4096, 256 * 1024, MAX_IMAGE_BYTES)


def dimensions_b64(data: str) -> tuple[int, int] | None:
    """`dimensions` of a picture given as base64 text, decoding as little of it as tells."""
    for n in HEAD_BYTES:
        head = data[:encoded_size_bound(n)]  # a whole number of 4-character groups
        try:
            found = dimensions(base64.b64decode(head, validate=True))
        except (binascii.Error, ValueError):
            return None
        if found is not None or len(head) == len(data):
            return found
    return None


def pixel_problem(sources: Sequence[Source], megapixels: int) -> tuple[str, str] | None:
    """(why, where) when a picture's header claims more than MAX_PIXELS, or the pictures'
    together more than `megapixels` million (each named with its size); None when they fit, or
    when a header does not say (the runner reads that picture, and refuses it if it must)."""
    limit = megapixels * 1_000_000
    sized: list[tuple[Source, int, int]] = []
    total, over = 0, None
    for s in sources:
        found = dimensions_b64(s.data) if s.data is not None else None
        if found is None:
            continue
        w, h = found
        if w * h > MAX_PIXELS:
            return (f"`{s.where}`: the image cannot be used: {w}x{h} pixels is more than the "
                    f"{MAX_PIXELS // 1_000_000} megapixels a picture may have", s.where)
        sized.append((s, w, h))
        total += w * h
        if over is None and total > limit:
            over = s.where
    if over is None:
        return None
    shown = ", ".join(f"`{s.where}` {w}x{h}" for s, w, h in sized)
    return (f"{shown}: {total / 1e6:.1f} megapixels in all, more than the {megapixels} "
            "megapixels a request's pictures may have together (api.max_request_megapixels)",
            over)
