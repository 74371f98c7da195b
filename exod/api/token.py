"""The API's bearer token file, read the same way by the daemon and by `exoctl chat`.

One token per line: several clients (or an old and a new token, while rotating) can each have
their own. Blank lines and lines starting with '#' are skipped. The daemon re-reads the file on
reload, so a rotated token needs no restart.
"""

from __future__ import annotations

import errno
import os

MAX_TOKEN_FILE = 1 << 20


def read_tokens(path: os.PathLike[str] | str) -> list[str]:
    """Every token in the file. Raises OSError (one line, never the file's content) when
    unusable."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_TOKEN_FILE + 1)
    except OSError as e:
        raise OSError(e.errno or errno.EIO,
                      f"api.token_file {path}: {e.strerror or e}") from None
    if len(raw) > MAX_TOKEN_FILE:
        raise OSError(errno.EFBIG, f"api.token_file {path}: larger than {MAX_TOKEN_FILE} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise OSError(errno.EINVAL, f"api.token_file {path}: not UTF-8 text") from None
    tokens = [t for t in (line.strip() for line in text.splitlines())
              if t and not t.startswith("#")]
    if not tokens:
        raise OSError(errno.EINVAL, f"api.token_file {path}: the file holds no token")
    if any(not t.isascii() or not t.isprintable() or " " in t for t in tokens):
        raise OSError(errno.EINVAL, f"api.token_file {path}: a token must be printable ASCII "
                                    "without spaces")
    return tokens


def read_token(path: os.PathLike[str] | str) -> str:
    """The first token (what `exoctl chat` sends)."""
    return read_tokens(path)[0]
