"""Files and folders in exod's caches (the hub's, the prompt cache's), taken for what they are.

Whatever stands at a name (a link, a FIFO, a folder where a file should be, a file where a
folder should be, something unreadable), nothing here follows a link out of the cache, opens
anything but a regular file (a FIFO would hold its reader forever), or removes anything outside
the cache: a link is removed as a link, its target left as it is. A removal says what it did,
so that a log line or an answer can say what happened, not what was meant to.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exod.core.sizes import format_size

KINDS = {stat.S_IFLNK: "a symlink", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket",
         stat.S_IFCHR: "a device", stat.S_IFBLK: "a device", stat.S_IFREG: "a file",
         stat.S_IFDIR: "a folder"}
MAX_SAID = 3  # what could not be removed, named in full (then a count)


def kind(st: os.stat_result) -> str:
    return KINDS.get(stat.S_IFMT(st.st_mode), "something else")


def strange(path: Path, want_folder: bool) -> str | None:
    """Why what stands at `path` is not what exod keeps there (a real folder, or a regular
    file), its target named for a link; None when it is, or nothing is there."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    ok = stat.S_ISDIR(st.st_mode) if want_folder else stat.S_ISREG(st.st_mode)
    if ok:
        return None
    what = kind(st)
    if stat.S_ISLNK(st.st_mode):
        what += f" to {_target(path)}"
    return f"{what}, not {'a folder' if want_folder else 'a file'}"


def read_regular(path: Path, limit: int = 1 << 20) -> bytes:
    """The bytes of the regular file at `path` (at most `limit`): never through a link, never
    waiting on a FIFO. OSError otherwise, its text saying what stands there."""
    why = strange(path, want_folder=False)
    if why is not None:
        raise OSError(errno.EINVAL, f"{why} (not read)", str(path))
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # swapped since the lstat
            raise OSError(errno.EINVAL, f"{kind(st)}, not a file (not read)", str(path))
        if st.st_size > limit:
            raise OSError(errno.EFBIG, f"{st.st_size} bytes, more than {limit} (not read)",
                          str(path))
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(limit)
    finally:
        os.close(fd)


def _target(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


@dataclass
class Removal:
    """What one removal did."""

    path: Path
    what: str = ""  # what stood there ("a folder", "a symlink", "a FIFO"...); "": nothing
    target: str = ""  # a link's target, left as it is
    freed: int = 0  # bytes of regular files removed
    left: list[str] = field(default_factory=list)  # "PATH: why", what could not be removed

    @property
    def found(self) -> bool:
        return bool(self.what)

    @property
    def whole(self) -> bool:
        return self.found and not self.left

    def text(self) -> str:
        """One line: what was removed, and what was not and why."""
        if not self.found:
            return f"{self.path}: nothing there"
        if self.what.startswith("a symlink"):
            done = f"removed the symlink {self.path} (to {self.target}: not followed, the " \
                   "target is left as it is)"
        elif self.what == "a folder":
            done = f"removed {self.path} ({format_size(self.freed)})"
        else:
            done = f"removed {self.path} ({self.what})"
        if not self.left:
            return done
        more = f" and {len(self.left) - MAX_SAID} more" if len(self.left) > MAX_SAID else ""
        kept = "; ".join(self.left[:MAX_SAID]) + more
        if self.what == "a folder":
            done = f"removed {format_size(self.freed)} of {self.path}"
        else:
            done = f"did not remove {self.path} ({self.what})"
        return f"{done}; could not remove {kept}"


def remove(path: Path) -> Removal:
    """Remove whatever stands at `path`: a link as a link, a folder with what it holds (links
    inside it as links), anything else as a file. Never raises for what it meets: the Removal
    says what was removed and what was left, and why."""
    out = Removal(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return out
    except OSError as e:
        out.what = "something unreadable"
        out.left.append(f"{path}: {e.strerror or e}")
        return out
    out.what = kind(st)
    if not stat.S_ISDIR(st.st_mode):
        if stat.S_ISLNK(st.st_mode):
            out.target = _target(path)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            out.left.append(f"{path}: {e.strerror or e}")
            return out
        if stat.S_ISREG(st.st_mode):
            out.freed = st.st_size
        return out
    before = size(path)

    def failed(_fn: Any, where: str, exc: Any) -> None:
        e = exc if isinstance(exc, BaseException) else exc[1]
        if isinstance(e, FileNotFoundError):
            return
        out.left.append(f"{where}: {getattr(e, 'strerror', None) or e}")

    # rmtree walks by file descriptor where the system allows it: a folder swapped for a link
    # meanwhile is not followed either.
    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=failed)
    else:
        shutil.rmtree(path, onerror=failed)
    out.freed = before - (size(path) if out.left else 0)
    return out


def size(path: Path) -> int:
    """Bytes of the regular files under `path`, no link followed; what cannot be read counts
    nothing."""
    total = 0
    stack = [path]
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as it:
                for entry in it:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(Path(entry.path))
                    elif stat.S_ISREG(st.st_mode):
                        total += st.st_size
        except OSError:
            continue
    return total
