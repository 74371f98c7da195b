"""exod.yaml(5)'s KEYS section, generated from the schema as `exod check --explain` is: each key
with its type, default and documentation (`exod.config.explain.key_docs`), in roff.

`make man` (`python -m exod.config.manpage man/exod.yaml.5`) writes it into the page, between
two comment lines; tests/unit/test_manpages.py fails when the page and the schema differ. In
the documentation, `code` is set in bold; everything else is escaped for roff, so the page
stays ASCII and groff has nothing to warn about.
"""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

from exod.config.explain import KeyDoc, key_docs

BEGIN = ('.\\" The KEYS section is generated from exod/config/schema.py (`make man`): edit the '
         'schema, not this.')
END = '.\\" End of the generated KEYS section.'
WIDTH = 78
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
    """Filled text in lines of WIDTH, a line starting with `.` or `'` kept from being read as
    a request."""
    lines = textwrap.wrap(text, WIDTH, break_long_words=False, break_on_hyphens=False)
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


if __name__ == "__main__":
    for arg in sys.argv[1:] or ["man/exod.yaml.5"]:
        print(f"{arg}: {'written' if write(Path(arg)) else 'unchanged'}")
