"""The fields exod accepted and did not use (exod.api.fields: unknown ones, hosted tools): each
(dialect, field) logged once, counted for /metrics (`exod_ignored_fields_total`), and named in
the answer's `x-exod-ignored-fields` header.

Clients choose the names: at most MAX_TRACKED are kept (a hostile client cannot grow the
daemon's memory or the metric's label set); past that, they are counted under `(more)` and
logged once. Names in the header and labels keep printable ASCII only.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Iterable

from loguru import logger

HEADER = "x-exod-ignored-fields"
MAX_TRACKED = 256  # (dialect, field) pairs counted by name
MORE = "(more)"
MAX_HEADER_NAMES = 16
_UNSAFE = re.compile(r"[^\x21-\x7e]|,")  # a header's names: visible ASCII, no separator


def safe(name: str) -> str:
    return _UNSAFE.sub("?", name)


class IgnoredFields:
    def __init__(self, limit: int = MAX_TRACKED) -> None:
        self.limit = limit
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self._overflowed = False

    def record(self, dialect: str, names: Iterable[str]) -> None:
        for name in names:
            key = (dialect, safe(name))
            if key not in self.counts and len(self.counts) >= self.limit:
                if not self._overflowed:
                    self._overflowed = True
                    logger.warning("more than {} distinct ignored fields: the rest are counted "
                                   "as {} and not logged", self.limit, MORE)
                key = (dialect, MORE)
            elif key not in self.counts:
                logger.info("{} requests: field {} ignored (exod does not use it; reported in "
                            "the {} header)", dialect, key[1], HEADER)
            self.counts[key] += 1


def header(names: Iterable[str]) -> dict[str, str]:
    """The response header naming what a request's body held and exod did not use."""
    listed = [safe(n) for n in names]
    if not listed:
        return {}
    shown = listed[:MAX_HEADER_NAMES]
    more = f", ...{len(listed) - len(shown)} more" if len(listed) > len(shown) else ""
    return {HEADER: ", ".join(shown) + more}
