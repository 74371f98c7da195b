"""The version stamp `exod install` writes into every service file, and reading it back.

`exod check` compares an installed file's stamp with the running exod: a unit or plist written
by an older exod may lack settings the newer daemon relies on (a longer TimeoutStopSec, a new
drop-in), which would otherwise only show at the next start.
"""

from __future__ import annotations

import re

from exod import __version__

STAMP_WORDS = "installed by exod"
_STAMP = re.compile(r"installed by exod (\S+?)(?: |$|-->)", re.MULTILINE)


def stamp_comment(kind: str) -> str:
    """The stamp line for a file of `kind` ("unit" or "plist"), without a trailing newline."""
    words = f"{STAMP_WORDS} {__version__} (`exod install`; `exod uninstall` removes it)"
    return f"<!-- {words} -->" if kind == "plist" else f"# {words}"


def stamped(text: str, kind: str) -> str:
    """`text` with the stamp as its first line (after the XML header for a plist)."""
    line = stamp_comment(kind)
    if kind == "plist" and text.startswith("<?xml"):
        head, _, rest = text.partition("\n")
        return f"{head}\n{line}\n{rest}"
    return f"{line}\n{text}"


def read_stamp(text: str) -> str | None:
    m = _STAMP.search(text)
    return m.group(1) if m else None


def version_key(v: str) -> tuple[int, ...]:
    """Release numbers only ("0.10.1rc2" -> (0, 10, 1)): enough to order exod's releases."""
    release = re.match(r"[\d.]+", v)
    return tuple(int(p) for p in release.group(0).split(".") if p) if release else ()


def older(installed: str, running: str = __version__) -> bool:
    return version_key(installed) < version_key(running)
