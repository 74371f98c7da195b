"""A reference of every config key, generated from the schema: as text (`exod check --explain`)
and as exod.yaml(5)'s KEYS section in roff.

`make man` (`write_pages`) writes the section into the page,
between two comment lines; tests/unit/test_manpages.py fails when the page and the schema
differ. In the documentation, `code` is set in bold; everything else is escaped for roff, so
the page stays ASCII and groff has nothing to warn about.
"""

from __future__ import annotations

import dataclasses
import math
import re
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from exod.core.durations import format_duration
from exod.config.schema import Config
from exod.core.sizes import format_size
from exod.core.kinds import Kind
from exod.config.validate import field_hints, settable_fields, unwrap

_KIND_NAMES = {
    Kind.DURATION: "duration",
    Kind.MODEL_DIR: "model directory holding config.json",
    Kind.PATH: "path",
    Kind.INSTANCE_NAME: "instance name",
    Kind.OCTAL: "octal file mode",
    Kind.SIZE: "size in bytes (512MiB, 2GiB, 800MB)",
    Kind.DURATION_OR_NEVER: "duration or never",
    Kind.JSON: "any value (plain data, as JSON has it)",
    Kind.NETWORK: "IP network (10.1.0.0/16, fd00::/8) or address",
    Kind.COUNT_OR_AUTO: "integer or auto",
}

WIDTH = 96  # a documentation line of --explain, indent included

_PREAMBLE = [
    "Durations are 500ms, 10s, 2m, 1h, 1m30s or a number of seconds.",
    "Relative paths are taken from the folder of the file that holds them; ~ is expanded.",
    "Files matched by `include:` may hold only `instances:`.",
    "",
]


@dataclass(frozen=True)
class KeyDoc:
    """One key as an operator writes it: `instances.<name>.stop.grace`, its type (`duration`),
    its default (`default: from defaults.stop.grace`) and its documentation."""

    key: str
    kind: str
    default: str
    doc: str


def explain_keys() -> str:
    """Every key an operator can write, with its type, default and documentation."""
    lines = list(_PREAMBLE)
    for k in key_docs():
        lines += [k.key, f"    {k.kind}; {k.default}"]
        if k.doc:
            lines += textwrap.wrap(k.doc, WIDTH, initial_indent="    ",
                                   subsequent_indent="    ", break_on_hyphens=False)
        lines.append("")
    return "\n".join(lines) + "\n"


def key_docs() -> list[KeyDoc]:
    """Every settable key, in the schema's order (what --explain prints, and exod.yaml(5))."""
    out: list[KeyDoc] = []
    _walk(Config, "", None, out)
    return out


def _walk(cls: type, prefix: str, inherited: str | None, out: list[KeyDoc]) -> None:
    """inherited: e.g. "defaults.stop." when the keys below take their defaults from there."""
    hints = field_hints(cls)
    for f in settable_fields(cls):
        key = f"{prefix}{f.name}"
        bare, kind, _ = unwrap(hints[f.name])
        if "inherit" in f.metadata:
            source: str | None = f"defaults.{f.metadata['inherit']}"
        else:
            source = f"{inherited}{f.name}" if inherited else None
        out.append(KeyDoc(key, type_name(hints[f.name], f.metadata), _default(f, kind, source),
                          str(f.metadata.get("doc", ""))))
        origin = get_origin(bare)
        if isinstance(bare, type) and dataclasses.is_dataclass(bare):
            _walk(bare, f"{key}.", f"{source}." if source else None, out)
        elif origin is tuple and dataclasses.is_dataclass(get_args(bare)[0]):
            _walk(get_args(bare)[0], f"{key}[].", None, out)
        elif origin is Mapping and dataclasses.is_dataclass(get_args(bare)[1]):
            _walk(get_args(bare)[1], f"{key}.<name>.", None, out)


def type_name(hint: Any, meta: Mapping[str, object] | None = None) -> str:
    """Operator-facing name of a field type: `integer, 1 to 64`, `list of string`, …"""
    meta = meta or {}
    bare, kind, optional = unwrap(hint)
    origin = get_origin(bare)
    if kind is not None:
        name = _KIND_NAMES[kind]
    elif origin is Literal:
        name = "one of " + " | ".join(str(a).lower() if isinstance(a, bool) else str(a)
                                      for a in get_args(bare))
    elif origin is tuple:
        name = f"list of {type_name(get_args(bare)[0])}"
    elif origin is Mapping and dataclasses.is_dataclass(get_args(bare)[1]):
        name = "mapping of name to settings"
    elif origin is Mapping:
        name = f"mapping of string to {type_name(get_args(bare)[1])}"
    elif dataclasses.is_dataclass(bare):
        name = "mapping"
    else:
        names = {bool: "true or false", int: "integer", float: "number", str: "string"}
        name = names.get(bare, "path")
    name += _bounds(meta, kind)
    if isinstance(meta.get("pattern"), str):
        name += f", matching {meta['pattern']}"
    return f"{name}, or null" if optional else name


def _bounds(meta: Mapping[str, object], kind: Kind | None) -> str:
    low, high = meta.get("minimum"), meta.get("maximum")
    timed = kind in (Kind.DURATION, Kind.DURATION_OR_NEVER)
    show = format_duration if timed else _number
    if (timed or kind is Kind.SIZE) and low == 0:
        low = None  # every duration is >= 0; saying so on each line is noise
    if isinstance(meta.get("above"), (int, float)):
        return f", more than {show(meta['above'])}"  # type: ignore[arg-type]
    if isinstance(low, (int, float)) and isinstance(high, (int, float)):
        return f", {show(low)} to {show(high)}"
    if isinstance(low, (int, float)):
        return f", at least {show(low)}"
    if isinstance(high, (int, float)):
        return f", at most {show(high)}"
    return ""


def _number(x: float) -> str:
    """Integers in full (byte counts are too long for %g), other numbers short."""
    return str(x) if isinstance(x, int) else f"{x:g}"


def _default(f: dataclasses.Field[Any], kind: Kind | None, source: str | None) -> str:
    factory = f.default_factory
    if source:
        partial = ""
        if dataclasses.is_dataclass(factory):
            partial = " (keys written here override only themselves)"
        return f"default: from {source}{partial}"
    if f.default is not dataclasses.MISSING:
        return f"default: {_show(f.default, kind)}"
    if factory is dataclasses.MISSING:
        return "required"
    if dataclasses.is_dataclass(factory):
        return "default: see the keys below"
    if factory in (dict, list, tuple):
        return "default: empty"
    return "default: computed at start-up (see the description)"


def _show(value: object, kind: Kind | None) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if kind is Kind.DURATION_OR_NEVER and value == math.inf:
        return "never"
    if kind in (Kind.DURATION, Kind.DURATION_OR_NEVER) and isinstance(value, (int, float)):
        return format_duration(value)
    if kind is Kind.SIZE and isinstance(value, int):
        return format_size(value)
    if kind is Kind.OCTAL and isinstance(value, int):
        return f"0{value:o}"
    if isinstance(value, (int, float)):
        return _number(value)
    if isinstance(value, tuple):
        return "empty" if not value else ", ".join(_show(v, None) for v in value)
    text = str(value)
    return repr(text) if text == "" or text.strip() != text else text


# ---- exod.yaml(5) -----------------------------------------------------------------------------
BEGIN = ('.\\" The KEYS section is generated from exod/config/schema.py and exod/wire/options.py '
         '(`make man`): edit the schema, not this.')
END = '.\\" End of the generated KEYS section.'
ROFF_WIDTH = 78
INTRO = ("Each key is listed with its type and default, then what it does;\n"
         ".B exod check \\-\\-explain\n"
         "prints the same.")

# The characters the schema's text uses beyond ASCII, as roff names them.
GLYPHS = {"\u2026": "...", "\u2192": "\\(->", "\u00d7": "\\(mu", "\u00b5": "\\(mc",
          "\u2264": "\\(<=", "\u2265": "\\(>=", "\u2014": "\\(em", "\u2013": "\\(en",
          "\u00e9": "\\('e", "\u00b1": "\\(+-", "\u2248": "\\(~~"}


def keys_roff() -> str:
    """The section, from its `.SH KEYS` line to the end of its last key."""
    out = [".SH KEYS", INTRO]
    for k in key_docs():
        if "." not in k.key:
            out.append(f".SS {k.key}")
        out += _entry(k)
    return "\n".join(out) + "\n"


def _entry(k: KeyDoc) -> list[str]:
    kind, default = _text(k.kind), _text(k.default)
    head = f"{kind[:1].upper()}{kind[1:]}; {default}."
    text = head if not k.doc else f"{head} {k.doc}"
    return [".TP", f".B {_escape(k.key, code=True)}", *_lines(_roff(text))]


def _text(s: str) -> str:
    """A type or a default as prose: what is not prose in it (a pattern) as code."""
    return re.sub(r"(matching )(\S+)", lambda m: f"{m[1]}`{m[2]}`", s)


def _roff(text: str) -> str:
    """Documentation text (with `code` spans) as roff text: code in bold, the rest escaped."""
    parts = text.split("`")
    if len(parts) % 2 == 0:
        raise ValueError(f"an odd number of backquotes in {text!r}")
    out = []
    for i, part in enumerate(parts):
        code = i % 2 == 1
        out.append(f"\\fB{_escape(part, code)}\\fR" if code and part else _escape(part))
    return "".join(out)


def _escape(s: str, code: bool = False) -> str:
    s = s.replace("\\", "\\e")
    if code:
        s = s.replace("-", "\\-")  # a minus or a dash of an option, never a hyphenation point
    for char, name in GLYPHS.items():
        s = s.replace(char, name)
    bad = [c for c in s if not c.isascii()]
    if bad:
        raise ValueError(f"no roff name for {bad[0]!r} (add it to GLYPHS): {s!r}")
    return s


def _lines(text: str) -> list[str]:
    """Filled text in lines of ROFF_WIDTH, a line starting with `.` or `'` kept from being read as
    a request."""
    lines = textwrap.wrap(text, ROFF_WIDTH, break_long_words=False, break_on_hyphens=False)
    return [f"\\&{line}" if line.startswith((".", "'")) else line for line in lines]


def generated(page: str) -> str:
    """The section as it stands in `page`, between BEGIN and END."""
    start, end = page.index(BEGIN + "\n") + len(BEGIN) + 1, page.index(END + "\n")
    return page[start:end]


def write(path: Path) -> bool:
    """Put the section into the page at `path`; whether it changed."""
    page = path.read_text(encoding="utf-8")
    new = page.replace(generated(page), keys_roff(), 1)
    if new != page:
        path.write_text(new, encoding="utf-8")
    return new != page


def write_pages(paths: list[str]) -> None:
    """`make man`: each page's KEYS section from the schema, saying which changed."""
    for arg in paths:
        print(f"{arg}: {'written' if write(Path(arg)) else 'unchanged'}")
