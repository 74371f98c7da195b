"""Reading systemd unit files: sections of `Key=Value` lines, drop-ins applied in order.

Enough of systemd.syntax(7) to read the settings exod cares about: comments, line
continuations with a trailing backslash, and later assignments overriding earlier ones (an empty
assignment resets a key).
"""

from __future__ import annotations

from pathlib import Path

Unit = dict[str, dict[str, str]]  # section → key → last value (lists: every value, joined)

# Settings whose assignments add up (an empty one resets them): kept space-joined.
LIST_KEYS = frozenset({"BindPaths", "BindReadOnlyPaths", "InaccessiblePaths", "ReadOnlyPaths",
                       "ReadWritePaths", "SupplementaryGroups", "Environment"})


def parse_unit(text: str, into: Unit | None = None) -> Unit:
    unit: Unit = into if into is not None else {}
    section = ""
    pending = ""
    for raw in text.splitlines():
        line = pending + raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            unit.setdefault(section, {})
            continue
        key, sep, value = line.partition("=")
        if sep:
            key, value = key.strip(), value.strip()
            settings = unit.setdefault(section, {})
            if key in LIST_KEYS and value and settings.get(key):
                value = f"{settings[key]} {value}"
            settings[key] = value
    return unit


def load_unit(path: Path) -> Unit:
    """The unit plus its drop-ins (`NAME.d/*.conf`, sorted), as systemd would merge them."""
    unit = parse_unit(path.read_text())
    dropins = path.parent / f"{path.name}.d"
    if dropins.is_dir():
        for conf in sorted(dropins.glob("*.conf")):
            parse_unit(conf.read_text(), unit)
    return unit
