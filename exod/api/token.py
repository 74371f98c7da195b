"""The API's bearer token file, read the same way by the daemon and by `exoctl chat`."""

from __future__ import annotations

import errno
import os


def read_token(path: os.PathLike[str] | str) -> str:
    """The bearer token: the file's first line. Raises OSError (one line) when unusable."""
    try:
        with open(path, encoding="utf-8") as f:
            token = f.readline().strip()
    except OSError as e:
        raise OSError(e.errno or errno.EIO,
                      f"api.token_file {path}: {e.strerror or e}") from None
    if not token:
        raise OSError(errno.EINVAL, f"api.token_file {path}: the file holds no token")
    return token
