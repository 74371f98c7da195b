"""Files that hold a secret: the API's bearer tokens (`api.token_file`), the hub's access token
(`hub.hf_token_file`), a group's key (`cluster_key_file`, or the one exod makes for a group
on one host) and the cluster's key (`cluster.key_file`). One rule for all of them, and one
reader, which `exod check` and every process that reads a secret use alike.

The rule: a regular file that other users can neither read nor write (its group may read it:
the users of `exoctl chat` read the API's tokens through exod's group, and a group's key may
be shared so across hosts), not empty (a key: at least `least` bytes) and at most MAX_BYTES.
It is checked on the file as opened (fstat), so what is checked is what is read. A message
names the file and the fix, never what the file holds.
"""

from __future__ import annotations

import errno
import os
import stat

MAX_BYTES = 1 << 20
KEY_BYTES = 16  # the least a group's key holds
OTHERS = 0o007  # any access by other users


class SecretFileError(OSError):
    """One line naming the file and what is wrong with it (never its content); also its
    strerror, for callers that show an OSError's."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.EINVAL, message)

    def __str__(self) -> str:
        return str(self.strerror)


def read_secret(path: os.PathLike[str] | str, least: int = 1) -> bytes:
    """The file's content without surrounding whitespace; SecretFileError when it breaks the
    rule or cannot be read."""
    try:
        # O_NONBLOCK: a FIFO planted there must not hang the open (it is refused below).
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        raise SecretFileError(f"cannot read {path}: {e.strerror or e}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SecretFileError(f"{path} is not a regular file")
        if st.st_mode & OTHERS:
            raise SecretFileError(
                f"{path} has mode {stat.S_IMODE(st.st_mode):04o}: a secret must be closed to "
                f"other users (chmod 600 {path}, or 640 to let its group read it)")
        try:
            data = f.read(MAX_BYTES + 1)
        except OSError as e:
            raise SecretFileError(f"cannot read {path}: {e.strerror or e}") from None
    if len(data) > MAX_BYTES:
        raise SecretFileError(f"{path} is larger than {MAX_BYTES} bytes: not a secret")
    data = data.strip()
    if len(data) < least:
        raise SecretFileError(f"{path} is empty" if not data else
                              f"{path} holds fewer than {least} bytes: too short for a secret")
    return data


def secret_problem(path: os.PathLike[str] | str, least: int = 1) -> str | None:
    """Why `path` cannot serve as a secret (read_secret's message), or None."""
    try:
        read_secret(path, least)
    except SecretFileError as e:
        return str(e)
    return None
