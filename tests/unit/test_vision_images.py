"""A request's pictures as the vision runner decodes them (exod.runner.vision.images, PIL only):
a good picture of each format comes out RGB and upright; a 100-megapixel PNG, a decompression
bomb, a truncated JPEG, garbage, an unknown format and an oversized or non-base64 payload are
each an ImageError saying why, within a fraction of a second."""

from __future__ import annotations

import base64
import io
import random
import struct
import time
import zlib

import pytest
from PIL import Image

from exod.core import images as limits
from exod.core.images import ImageError
from exod.runner.vision.images import decode


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def encoded(img: Image.Image, fmt: str, **kw: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def png_claiming(width: int, height: int) -> bytes:
    """A PNG whose header claims `width` x `height` pixels over a few bytes of data: a
    decompression bomb's shape (a real one's data would inflate to all of them)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(b"\0" * 1024, 9)) + chunk(b"IEND", b""))


@pytest.mark.parametrize("fmt, mode", [("PNG", "RGBA"), ("JPEG", "RGB"), ("WEBP", "RGB"),
                                       ("GIF", "P"), ("PNG", "L")])
def test_a_good_picture_comes_out_rgb(fmt: str, mode: str) -> None:
    img = decode(b64(encoded(Image.new(mode, (64, 48)), fmt)))
    assert img.mode == "RGB" and img.size == (64, 48)


def test_a_picture_is_turned_upright_by_its_exif_orientation() -> None:
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated 90 degrees: shown 48 wide and 64 high
    img = decode(b64(encoded(Image.new("RGB", (64, 48)), "JPEG", exif=exif.tobytes())))
    assert img.size == (48, 64)


HOSTILE = [
    ("a 100-megapixel PNG", lambda: encoded(Image.new("1", (10000, 10000)), "PNG"),
     "10000x10000 pixels is more than the 50 megapixels"),
    ("a decompression bomb", lambda: png_claiming(100_000, 100_000),
     "its header claims more than the 50 megapixels"),
    ("a smaller bomb", lambda: png_claiming(9000, 9000),
     "9000x9000 pixels is more than the 50 megapixels"),
    ("a truncated JPEG",
     lambda: encoded(Image.new("RGB", (640, 480), (9, 99, 199)), "JPEG")[:2000],
     "a broken JPEG file: image file is truncated"),
    ("a PNG whose data is cut",
     lambda: encoded(Image.frombytes("RGB", (256, 256), random.Random(0).randbytes(196608)),
                     "PNG")[:20000],
     "a broken PNG file"),
    ("garbage", lambda: b"\x00not a picture at all" * 100, "not a picture in a known format"),
    ("a BMP (not a format taken)", lambda: encoded(Image.new("RGB", (8, 8)), "BMP"),
     "not a picture in a known format (JPEG, PNG, WEBP, GIF)"),
]


@pytest.mark.parametrize("what, make, why", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_hostile_picture_is_refused_quickly(what: str, make: object, why: str) -> None:
    data = b64(make())  # type: ignore[operator]
    t0 = time.monotonic()
    with pytest.raises(ImageError) as info:
        decode(data)
    assert time.monotonic() - t0 < 1.0, what
    assert why in str(info.value), str(info.value)


def test_a_payload_too_big_or_not_base64_is_refused_before_decoding() -> None:
    with pytest.raises(ImageError, match="larger than 20MiB"):
        decode("A" * (limits.encoded_size_bound(limits.MAX_IMAGE_BYTES) + 4))
    with pytest.raises(ImageError, match="not base64"):
        decode("iVBOR w0K!!")
    with pytest.raises(ImageError, match="empty"):
        decode("")
