"""What an image of a request may be, checked where it is cheap: its bytes on the wire here
(pure, both ends), its pixels in the runner before any is decoded (exod.runner.vision.images).

A `Generate` carries images as base64 text in its JSON frame (exod.messages.Image), and its
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
from dataclasses import dataclass
from typing import Any

from exod.core.request_rules.base import RequestError
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
