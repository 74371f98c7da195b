"""A request's pictures, decoded and checked in the runner, off the serve loop (the reader's
thread): whatever a client sent is either an RGB picture at most a little larger than the
model's own resolution, or a clean refusal within a fraction of a second, never a crash, a
stall or a memory blow-up.

The format is told from the bytes and the size from the header, before any pixel is decoded: a
100-megapixel PNG of one colour or a decompression bomb is refused there, and so is a request
whose pictures would take more than the runner's budget (`PictureBudget`). A picture is turned
upright by its EXIF orientation and made RGB, as mlx-vlm's own `load_image` does, so the same
file gives the same pixels (and tokens) here as there. A picture of more than 4 megapixels and
at least twice the size the processor makes of it (`Fit`) is reduced while it is decoded (a
JPEG in libjpeg's draft mode, others a strip at a time), where decoding it whole would hold
hundreds of megabytes of RGB for the processor to resize; a smaller one is decoded as mlx-vlm
decodes it. Pictures are decoded one at a time, on the reader's one thread. The limits and what
they cost: docs/vision.md, "Limits".
"""

from __future__ import annotations

import ctypes
import ctypes.util
import io
import math
import sys
import threading
import warnings
import weakref
from dataclasses import dataclass
from typing import Any

from exod.core import images as limits
from exod.core.images import ImageError
from exod.core.memory import DECODED_BYTES_PER_PIXEL, PROCESSED_BYTES_PER_PIXEL
from exod.core.sizes import format_size

FORMATS = ("JPEG", "PNG", "WEBP", "GIF")
ORIENTATION = 0x0112  # EXIF's tag
STRIP_PIXELS = 1 << 22  # made RGB and reduced a strip of about this many pixels at a time
REDUCED_ABOVE = 4_000_000  # pixels: a picture of at most this many is decoded whole, as it is


@dataclass(frozen=True)
class Fit:
    """The size the model's processor makes of a picture, as far as reducing it needs: at most
    `area` pixels, its aspect kept (Qwen's `max_pixels`); its longer or shorter side made
    `longest` or `shortest` (Pixtral, Idefics3; CLIP); or exactly `width` x `height` (Gemma 3,
    SigLIP). All zero: unknown, never reduced."""

    area: int = 0
    longest: int = 0
    shortest: int = 0
    width: int = 0
    height: int = 0

    def factors(self, width: int, height: int) -> tuple[int, int]:
        """By how much a picture of `width` x `height` is reduced (across, down), still at
        least what the processor makes of it: the same both ways, unless the processor ignores
        the aspect; not at all at REDUCED_ABOVE pixels or fewer."""
        if width * height <= REDUCED_ABOVE:
            return 1, 1
        if self.width and self.height:
            return max(1, width // self.width), max(1, height // self.height)
        if self.area:
            f = math.isqrt(width * height // self.area)
        elif self.longest:
            f = max(width, height) // self.longest
        elif self.shortest:
            f = min(width, height) // self.shortest
        else:
            f = 1
        return max(1, f), max(1, f)

    def made(self, width: int, height: int) -> int:
        """About how many pixels the processor makes of a picture of `width` x `height`: its
        arrays' size (a CLIP processor's resize before its crop: a long thin picture is
        widened to a huge one)."""
        if self.width and self.height:
            return self.width * self.height
        if self.area:
            return min(self.area, width * height)
        side = max(width, height) if self.longest else min(width, height)
        edge = self.longest or self.shortest
        return math.ceil(width * height * (edge / side) ** 2) if edge else width * height

    def reduced(self, width: int, height: int) -> tuple[int, int]:
        """The size a picture of `width` x `height` is decoded at."""
        fx, fy = self.factors(width, height)
        if fx < 2 and fy < 2:
            return width, height
        return -(-width // fx), -(-height // fy)


def fit_of(processor: Any) -> Fit:
    """How the model's processor sizes pictures, read from its image processor's settings
    (`Fit()` when they do not say, or when it crops before it resizes: Gemma 3's pan and
    scan)."""
    ip = getattr(processor, "image_processor", None)
    if ip is None or getattr(ip, "do_resize", True) is False \
            or getattr(ip, "do_pan_and_scan", False):
        return Fit()
    size = getattr(ip, "size", None)
    area = _positive(getattr(ip, "max_pixels", None)) or _positive(_get(size, "max_pixels"))
    if area:
        return Fit(area=area)
    height, width = _positive(_get(size, "height")), _positive(_get(size, "width"))
    if height and width:
        return Fit(width=width, height=height)
    longest, shortest = _positive(_get(size, "longest_edge")), _positive(_get(size,
                                                                              "shortest_edge"))
    return Fit(longest=longest) if longest else Fit(shortest=shortest)


def _get(size: Any, key: str) -> Any:
    return size.get(key) if isinstance(size, dict) else getattr(size, key, None)


def _positive(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


@dataclass
class Opened:
    """A picture whose header was read: PIL's image, not decoded yet, and its size."""

    image: Any
    width: int
    height: int

    def cost(self, fit: Fit) -> int:
        """Bytes it takes once decoded at the model's resolution, and the processor's arrays
        of it."""
        w, h = fit.reduced(self.width, self.height)
        return w * h * DECODED_BYTES_PER_PIXEL + fit.made(w, h) * PROCESSED_BYTES_PER_PIXEL


def open_picture(data: str) -> Opened:
    """One image's base64 text, its header read and checked (its format, its size), no pixel
    decoded; ImageError saying why not."""
    from PIL import Image, UnidentifiedImageError

    raw = limits.decode(data)
    with warnings.catch_warnings():
        # PIL warns (then raises) past its own pixel limit; ours is lower and checked first.
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            img = Image.open(io.BytesIO(raw), formats=FORMATS)  # the header only
        except UnidentifiedImageError:
            raise ImageError(f"not a picture in a known format ({', '.join(FORMATS)})") \
                from None
        except Image.DecompressionBombError:  # PIL's own limit, above ours
            raise ImageError(f"its header claims more than the "
                             f"{limits.MAX_PIXELS // 1_000_000} megapixels a picture may "
                             "have") from None
        except (OSError, ValueError, SyntaxError) as e:
            raise ImageError(f"unreadable: {_why(e)}") from None
    width, height = img.size
    if width < 1 or height < 1:
        raise ImageError(f"a picture of {width}x{height} pixels")
    if width * height > limits.MAX_PIXELS:
        raise ImageError(f"{width}x{height} pixels is more than the "
                         f"{limits.MAX_PIXELS // 1_000_000} megapixels a picture may have")
    return Opened(img, width, height)


def decode_opened(opened: Opened, fit: Fit = Fit()) -> Any:
    """The RGB PIL image of a picture opened, reduced while decoded where `fit` says; ImageError
    saying why not."""
    from PIL import Image, ImageFile, ImageOps

    img, opened.image = opened.image, None  # the whole picture goes once decoded
    kind = img.format
    fx, fy = fit.factors(opened.width, opened.height)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            img.seek(0)
            if fx >= 2 or fy >= 2:
                if kind == "JPEG":  # libjpeg decodes at 1/2, 1/4 or 1/8 scale
                    img.draft(img.mode, fit.reduced(opened.width, opened.height))
                img.load()
                orientation = img.getexif().get(ORIENTATION)
                img = _reduced(img, *fit.factors(*img.size))
                if isinstance(orientation, int) and 2 <= orientation <= 8:
                    img.getexif()[ORIENTATION] = orientation  # turned as the whole would be
            else:  # as mlx-vlm's load_image: the same pixels (without its copy of an upright one)
                img.load()
            if img.getexif().get(ORIENTATION, 1) != 1:
                img = ImageOps.exif_transpose(img)
            # One made here is RGB already; one still tied to its file is copied (or converted).
            fresh = img.mode == "RGB" and not isinstance(img, ImageFile.ImageFile)
            return img if fresh else img.convert("RGB")
        except (OSError, ValueError, EOFError, SyntaxError, MemoryError,
                Image.DecompressionBombError) as e:
            raise ImageError(f"a broken {kind} file: {_why(e)}") from None


def _reduced(img: Any, fx: int, fy: int) -> Any:
    """`img` made RGB and reduced by (fx, fy) (a mean over each box), a strip at a time: never
    a whole copy of it in RGB beside it."""
    from PIL import Image

    width, height = img.size
    if fx < 2 and fy < 2:
        return img.convert("RGB")
    out = Image.new("RGB", (-(-width // fx), -(-height // fy)))
    rows = max(fy, STRIP_PIXELS // width // fy * fy)
    for top in range(0, height, rows):
        strip = img.crop((0, top, width, min(height, top + rows))).convert("RGB")
        out.paste(strip.reduce((fx, fy)), (0, top // fy))
    return out


def decode(data: str, fit: Fit = Fit()) -> Any:
    """The RGB PIL image of one image's base64 text; ImageError saying why not."""
    return decode_opened(open_picture(data), fit)


def _why(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text[:200]


# ---- the budget ------------------------------------------------------------------------------
class PictureBudget:
    """Bytes of pictures decoded at the model's resolution (and the processor's arrays of them)
    that a runner holds at once, across requests: taken by a request's reading before its
    pictures are decoded, given back once the vision tower has seen them (or the request is
    gone). A reading waits while the requests read before it hold too much; a request that
    alone takes more is refused (exod.core.memory.picture_budget sets it, and memory admission
    counts it)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.held = 0
        self._cond = threading.Condition()

    def problem(self, need: int) -> str | None:
        if need <= self.total:
            return None
        return (f"they take {format_size(need)} at the model's resolution, more than the "
                f"{format_size(self.total)} a runner holds for pictures")

    def take(self, need: int) -> BudgetHold:
        """Wait until `need` fits beside what is held (or nothing is), then hold it."""
        with self._cond:
            self._cond.wait_for(lambda: self.held == 0 or self.held + need <= self.total)
            self.held += need
        return BudgetHold(self, need)

    def give(self, n: int) -> None:
        with self._cond:
            self.held -= n
            self._cond.notify_all()


class BudgetHold:
    """Bytes taken from a PictureBudget: given back by `release`, or when it is dropped."""

    def __init__(self, budget: PictureBudget, n: int) -> None:
        self.n = n
        self._give = weakref.finalize(self, budget.give, n)

    def release(self) -> None:
        self._give()  # once: a finalizer runs at most once


# ---- memory back to the system ----------------------------------------------------------------
def _trimmer() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return None


_TRIM = _trimmer()


def give_back_memory() -> None:
    """Hand the memory pictures were decoded in back to the system. glibc keeps what a thread
    freed in that thread's arena (the reader's): without this, a request of eight 50-megapixel
    pictures left the runner 1.4 GB larger for good."""
    if _TRIM is not None:
        _TRIM(0)
