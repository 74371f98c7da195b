"""Pictures have a budget per request and in all (issue 45): the daemon reads each picture's
size from its header (exod.core.images.dimensions, pure) and refuses a request whose pictures
have too many pixels together, naming each; the runner decodes each picture at the size its
model's processor makes of it (exod.runner.vision.images: a JPEG in libjpeg's draft mode, any
other format reduced a strip at a time), within a budget of bytes it counts across requests."""

from __future__ import annotations

import base64
import io
import random
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
from PIL import Image

from exod.core import images
from exod.core.images import Source, dimensions, dimensions_b64, pixel_problem
from exod.core.memory import DECODE_BYTES, PICTURE_BYTES_MAX, PICTURE_BYTES_MIN, Tower, \
    picture_budget
from exod.runner.vision import images as decoding
from exod.runner.vision.images import Fit, PictureBudget, decode, fit_of, open_picture


def encoded(img: Image.Image, fmt: str, **kw: Any) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def noise(width: int, height: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    bands = len(Image.new(mode, (1, 1)).getbands())
    raw = random.Random(seed).randbytes(width * height * bands)
    return Image.frombytes(mode, (width, height), raw)


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


# ---- the daemon: sizes from headers ------------------------------------------------------------
def gif_past_its_screen() -> bytes:
    """A GIF whose first frame reaches past its logical screen (PIL widens it to the frame)."""
    raw = bytearray(encoded(Image.new("P", (40, 30)), "GIF"))
    raw[6:10] = (10).to_bytes(2, "little") + (8).to_bytes(2, "little")  # the screen: 10x8
    return bytes(raw)


def exif_and_icc_jpeg() -> bytes:
    """A JPEG whose frame comes after ~190 KB of metadata (EXIF, a big ICC profile)."""
    exif = Image.Exif()
    exif[0x010E] = "x" * 60_000  # the image description
    return encoded(noise(300, 200), "JPEG", exif=exif.tobytes(),
                   icc_profile=random.Random(1).randbytes(130_000))


SIZED = [
    ("PNG RGBA", lambda: encoded(Image.new("RGBA", (123, 45)), "PNG")),
    ("PNG 1-bit", lambda: encoded(Image.new("1", (7071, 7071)), "PNG")),
    ("APNG", lambda: encoded(Image.new("RGB", (33, 22)), "PNG", save_all=True,
                             append_images=[Image.new("RGB", (33, 22), "red")])),
    ("JPEG baseline", lambda: encoded(noise(321, 123), "JPEG")),
    ("JPEG progressive", lambda: encoded(noise(64, 99), "JPEG", progressive=True)),
    ("JPEG with 190 KB of metadata", exif_and_icc_jpeg),
    ("GIF", lambda: encoded(Image.new("L", (70, 50)), "GIF")),
    ("GIF animated", lambda: encoded(Image.new("L", (70, 50)), "GIF", save_all=True,
                                     append_images=[Image.new("L", (70, 50), 9)])),
    ("GIF past its screen", gif_past_its_screen),
    ("WebP lossy", lambda: encoded(noise(301, 77), "WEBP", quality=50)),
    ("WebP lossless", lambda: encoded(noise(45, 67), "WEBP", lossless=True)),
    ("WebP with alpha", lambda: encoded(noise(45, 67, "RGBA"), "WEBP")),
    ("WebP animated", lambda: encoded(Image.new("RGB", (20, 30)), "WEBP", save_all=True,
                                      append_images=[Image.new("RGB", (20, 30), "red")])),
]


@pytest.mark.parametrize("what, make", SIZED, ids=[s[0] for s in SIZED])
def test_the_daemon_reads_a_picture_s_size_as_pil_does(what: str, make: Any) -> None:
    raw = make()
    want = Image.open(io.BytesIO(raw)).size
    assert dimensions(raw) == want, what
    assert dimensions_b64(b64(raw)) == want, what


def test_a_header_that_does_not_say_gives_no_size() -> None:
    png = encoded(Image.new("RGB", (5, 5)), "PNG")
    jpeg = exif_and_icc_jpeg()
    for raw in (png[:20], jpeg[:100_000], b"GIF89a\x05", b"RIFF\0\0\0\0WEBPVP8 ",
                b"\x00not a picture" * 10, encoded(Image.new("RGB", (8, 8)), "BMP"), b""):
        assert dimensions(raw) is None
    assert dimensions_b64("not base64!") is None


def test_a_request_past_its_megapixels_is_refused_naming_each_picture() -> None:
    png = b64(encoded(Image.new("1", (7071, 7071)), "PNG"))
    eight = [Source(f"messages[0].content[{i}]", data=png) for i in range(8)]
    t0 = time.monotonic()
    problem = pixel_problem(eight, images.REQUEST_MEGAPIXELS)
    assert time.monotonic() - t0 < 0.5
    assert problem is not None
    why, where = problem
    assert where == "messages[0].content[2]"  # the third takes it past 100 megapixels
    assert all(f"`messages[0].content[{i}]` 7071x7071" in why for i in range(8))
    assert "400.0 megapixels in all, more than the 100 megapixels" in why
    assert "api.max_request_megapixels" in why
    assert pixel_problem(eight, 400) is None  # 399,996,328 pixels
    assert pixel_problem(eight[:1], 50) is None


def test_a_picture_past_the_cap_is_refused_by_the_daemon_with_the_runner_s_words() -> None:
    png = b64(encoded(Image.new("1", (10000, 10000)), "PNG"))
    problem = pixel_problem([Source("messages[0].content[1]", data=png)], 800)
    assert problem == ("`messages[0].content[1]`: the image cannot be used: 10000x10000 "
                       "pixels is more than the 50 megapixels a picture may have",
                       "messages[0].content[1]")


def test_a_picture_whose_size_cannot_be_read_is_left_to_the_runner() -> None:
    garbage = Source("messages[0].content[0]", data=b64(b"\x00junk" * 100))
    url = Source("messages[0].content[1]", url="https://example.org/cat.png")
    assert pixel_problem([garbage, url], 1) is None


# ---- the runner: decoding at the model's resolution -------------------------------------------
def test_the_processor_s_settings_say_how_it_sizes_a_picture() -> None:
    def proc(**kw: Any) -> Any:
        return SimpleNamespace(image_processor=SimpleNamespace(**kw))

    assert fit_of(proc(max_pixels=12544, size=None)) == Fit(area=12544)  # Qwen
    assert fit_of(proc(size={"max_pixels": 99})) == Fit(area=99)
    assert fit_of(proc(size=SimpleNamespace(height=896, width=896))) == Fit(width=896,
                                                                           height=896)
    assert fit_of(proc(size={"longest_edge": 1024})) == Fit(longest=1024)  # Pixtral
    assert fit_of(proc(size={"shortest_edge": 336})) == Fit(shortest=336)  # CLIP
    # It does not say, or it crops before it resizes: never reduced.
    assert fit_of(proc(size=SimpleNamespace(height=896, width=896), do_pan_and_scan=True)) \
        == Fit()
    assert fit_of(proc(size={"longest_edge": 1024}, do_resize=False)) == Fit()
    assert fit_of(SimpleNamespace()) == Fit()


def test_a_picture_is_reduced_by_a_whole_factor_that_keeps_it_at_least_the_model_s_size(
        ) -> None:
    assert Fit(area=112 * 112).factors(7071, 7071) == (63, 63)
    assert Fit(area=112 * 112).reduced(7071, 7071) == (113, 113)
    assert Fit(area=112 * 112).reduced(200, 200) == (200, 200)  # small: as it is
    assert Fit(area=112 * 112).reduced(2000, 2000) == (2000, 2000)
    assert Fit(longest=1024).factors(50_000, 1000) == (48, 48)
    assert Fit(shortest=336).factors(50_000, 1000) == (2, 2)
    assert Fit(width=896, height=896).factors(8000, 2000) == (8, 2)  # the aspect is not kept
    assert Fit().factors(7071, 7071) == (1, 1)
    # What the processor makes: a CLIP processor widens a long thin picture to a huge one.
    assert Fit(shortest=336).made(7071, 10) == 79_828_762  # 336 high, 237,586 wide
    assert Fit(area=12544).made(7071, 7071) == 12544


def test_a_big_png_is_decoded_at_the_model_s_resolution_quickly() -> None:
    data = b64(encoded(Image.new("1", (7071, 7071), 1), "PNG"))
    t0 = time.monotonic()
    img = decode(data, Fit(area=112 * 112))
    assert time.monotonic() - t0 < 1.0
    assert img.mode == "RGB" and img.size == (113, 113)
    assert img.getpixel((0, 0)) == img.getpixel((112, 112)) == (255, 255, 255)


def test_a_strip_at_a_time_gives_what_the_whole_reduced_at_once_gives(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decoding, "STRIP_PIXELS", 97 * 40)  # strips of 36 rows (9 x 4)
    for mode in ("RGB", "RGBA", "L", "1", "P"):
        img = noise(97, 101, "L" if mode in ("1", "P") else mode).convert(mode)
        whole = img.convert("RGB").reduce((3, 4))
        assert decoding._reduced(img, 3, 4).tobytes() == whole.tobytes(), mode


def test_a_big_jpeg_decodes_in_draft_mode_and_stays_upright() -> None:
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated 90 degrees: shown 2000 wide and 4000 high
    raw = encoded(Image.new("RGB", (4000, 2000), (200, 30, 30)), "JPEG", exif=exif.tobytes())
    opened = open_picture(b64(raw))
    t0 = time.monotonic()
    img = decoding.decode_opened(opened, Fit(longest=500))
    assert time.monotonic() - t0 < 0.5
    assert img.size == (250, 500)  # libjpeg's 1/8 scale: 500 x 250, then turned upright
    assert opened.image is None  # the whole picture went as soon as it was decoded


def test_a_picture_of_4_megapixels_or_less_gives_mlx_vlm_s_pixels() -> None:
    from PIL import ImageOps

    for raw in (encoded(noise(64, 48, "RGBA"), "PNG"), encoded(noise(64, 48), "JPEG"),
                encoded(Image.new("P", (30, 20), 3), "GIF"),
                encoded(noise(2000, 1500), "JPEG")):  # 3 megapixels: decoded whole still
        mlx_vlm = ImageOps.exif_transpose(Image.open(io.BytesIO(raw))).convert("RGB")
        img = decode(b64(raw), Fit(area=112 * 112))
        assert img.size == mlx_vlm.size and img.tobytes() == mlx_vlm.tobytes()


def test_the_budget_holds_requests_back_in_turn_and_refuses_one_alone_too_big() -> None:
    budget = PictureBudget(100)
    assert budget.problem(100) is None
    assert "more than the 100B a runner holds for pictures" in (budget.problem(101) or "")
    first = budget.take(70)
    got: list[Any] = []
    waiting = threading.Thread(target=lambda: got.append(budget.take(50)))
    waiting.start()
    waiting.join(0.2)
    assert waiting.is_alive() and budget.held == 70  # 120 would not fit: it waits
    first.release()
    first.release()  # given back once
    waiting.join(5)
    assert not waiting.is_alive() and budget.held == 50
    got.clear()  # dropped (its request cancelled, or its reading thrown away): given back
    assert budget.held == 0
    big = budget.take(1000)  # alone (a caller asks `problem` first): it goes on
    assert budget.held == 1000
    big.release()


def test_memory_admission_counts_the_pictures_being_decoded() -> None:
    assert DECODE_BYTES == images.MAX_PIXELS * 4  # one whole at the cap, in PIL's widest mode
    assert picture_budget(None) == picture_budget(Tower(32, 64, 112 * 112)) \
        == PICTURE_BYTES_MIN
    assert picture_budget(Tower(1280, 65536, 12845056)) == PICTURE_BYTES_MAX  # Qwen2.5-VL's
