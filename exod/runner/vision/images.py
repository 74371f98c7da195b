"""A request's pictures, decoded and checked in the runner, off the serve loop (the reader's
thread): whatever a client sent is either an RGB picture of at most MAX_PIXELS, or a clean
refusal within a fraction of a second, never a crash, a stall or a memory blow-up.

The format is told from the bytes (JPEG, PNG, WebP, GIF; the first frame of an animation), and
the size from the header, before any pixel is decoded: a 100-megapixel PNG of one colour (tiny
on the wire) or a decompression bomb (a header claiming billions of pixels) is refused there. A
truncated or corrupt file fails while decoding. The picture is then turned upright by its EXIF
orientation and made RGB, as mlx-vlm's own `load_image` does, so the same file gives the same
pixels (and tokens) here as there.
"""

from __future__ import annotations

import io
import warnings
from typing import Any

from exod.core import images as limits
from exod.core.images import ImageError

FORMATS = ("JPEG", "PNG", "WEBP", "GIF")


def decode(data: str) -> Any:
    """The RGB PIL image of one image's base64 text; ImageError saying why not."""
    from PIL import Image, ImageOps, UnidentifiedImageError

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
        try:
            img.seek(0)
            img.load()
            upright = ImageOps.exif_transpose(img)
            return (upright if upright is not None else img).convert("RGB")
        except (OSError, ValueError, EOFError, SyntaxError, MemoryError,
                Image.DecompressionBombError) as e:
            raise ImageError(f"a broken {img.format} file: {_why(e)}") from None


def _why(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text[:200]
