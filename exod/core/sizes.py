"""Byte sizes: read from the config (`512MiB`, `2GiB`, `1.5G`, `800MB` or a number of bytes),
and written for people, everywhere exod shows one (status, `exod check`, errors, downloads).

KiB/MiB/GiB/TiB and the bare K/M/G/T are powers of 1024 (as free(1) and top show memory);
KB/MB/GB/TB are powers of 1000. Sizes are written in the first kind, as the config takes them
back: `format_size` is the one way exod writes a size, and nothing parses its text back.
"""

from __future__ import annotations

import math
import re

_UNITS = {"": 1, "B": 1,
          "K": 2**10, "KIB": 2**10, "KB": 10**3,
          "M": 2**20, "MIB": 2**20, "MB": 10**6,
          "G": 2**30, "GIB": 2**30, "GB": 10**9,
          "T": 2**40, "TIB": 2**40, "TB": 10**12}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*")
HINT = "use e.g. 512MiB, 2GiB, 800MB or a number of bytes"


def parse_size(value: object) -> int:
    """Bytes as an int. Raises ValueError (operator-facing) on anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"bad size {value!r}: {HINT}")  # noqa: TRY004
    if isinstance(value, (int, float)):
        number, unit = float(value), ""
    else:
        m = _SIZE.fullmatch(value)
        if not m or m.group(2).upper() not in _UNITS:
            raise ValueError(f"bad size {value!r}: {HINT}")
        number, unit = float(m.group(1)), m.group(2).upper()
    if number < 0:
        raise ValueError(f"bad size {value!r}: must not be negative")
    total = number * _UNITS[unit]
    if not math.isfinite(total) or total >= 2**63:
        raise ValueError(f"bad size {value!r}: too large")
    return int(total)


_WRITTEN = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def format_size(n: float) -> str:
    """`512MiB`, `1.5GiB`, `38.2GiB`, `900B`: the largest unit it reaches, one decimal (none
    when it is 0), as the config reads it back."""
    for unit, size in _WRITTEN:
        if abs(n) >= size * 0.99995:  # what rounds to 1024 of the unit below reads as 1 of it
            text = f"{n / size:.1f}"
            return f"{text.removesuffix('.0')}{unit}"
    return f"{n:.0f}B"
