"""The API's bearer token file, read the same way by the daemon and by `exoctl chat`.

One token per line: several clients (or an old and a new token, while rotating) can each have
their own. Blank lines and lines starting with '#' are skipped. The daemon re-reads the file on
reload, so a rotated token needs no restart.
"""

from __future__ import annotations

import os

from exod.secret_file import SecretFileError, read_secret


def read_tokens(path: os.PathLike[str] | str) -> list[str]:
    """Every token in the file (a secret file: exod.secret_file's rule). Raises OSError (one
    line, never the file's content) when unusable."""
    try:
        raw = read_secret(path, least=0)
    except SecretFileError as e:
        raise SecretFileError(f"api.token_file: {e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SecretFileError(f"api.token_file: {path} is not UTF-8 text") from None
    tokens = [t for t in (line.strip() for line in text.splitlines())
              if t and not t.startswith("#")]
    if not tokens:
        raise SecretFileError(f"api.token_file: {path} holds no token")
    if any(not t.isascii() or not t.isprintable() or " " in t for t in tokens):
        raise SecretFileError(f"api.token_file: {path}: a token must be printable ASCII "
                              "without spaces")
    return tokens


def read_token(path: os.PathLike[str] | str) -> str:
    """The first token (what `exoctl chat` sends)."""
    return read_tokens(path)[0]
