"""An append-only log of JSON lines in a private folder, rotated by size: `STEM-NNNNNNNN.jsonl`
files numbered in order, the newest written, the oldest removed past `keep` files. Each line
is written whole and fsynced before `append` returns, so a record the caller waited for
survives a crash of the daemon (kill -9) or of the host. Appends are serialised by a lock:
callers run them in a thread, off the event loop."""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from exod.paths import PRIVATE, make_dirs

FILE_MODE = 0o600
# Called with a file about to be removed by rotation, and its number.
Dropping = Callable[[Path, int], None]


def numbered(folder: Path, stem: str) -> list[tuple[int, Path]]:
    """The log's files, oldest first."""
    pattern = re.compile(rf"^{re.escape(stem)}-(\d{{8}})\.jsonl$")
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    found = [(int(m.group(1)), folder / n) for n in names if (m := pattern.match(n))]
    return sorted(found)


def lines(folder: Path, stem: str, after: int = 0) -> Iterator[tuple[int, bytes]]:
    """Every line of the log's files numbered above `after`, oldest first, with its file's
    number (a file removed meanwhile by rotation is skipped)."""
    for seq, path in numbered(folder, stem):
        if seq <= after:
            continue
        try:
            with open(path, "rb") as f:
                for line in f:
                    yield seq, line
        except FileNotFoundError:
            continue


class Journal:
    def __init__(self, folder: Path, stem: str, max_bytes: int, keep: int,
                 dropping: Dropping | None = None) -> None:
        self.folder, self.stem = folder, stem
        self.max_bytes, self.keep = max_bytes, keep
        self.dropping = dropping
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._seq = 0
        self._size = 0

    def open(self) -> None:
        """Make the folder (mode 0700) and open the newest file (a new one when it is full);
        raises OSError."""
        make_dirs(self.folder, PRIVATE)
        files = numbered(self.folder, self.stem)
        seq = files[-1][0] if files else 1
        with self._lock:
            self._open(seq)
            if self._size >= self.max_bytes:
                self._next()

    def _open(self, seq: int) -> None:
        path = self.folder / f"{self.stem}-{seq:08d}.jsonl"
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
        fd = os.open(path, flags, FILE_MODE)
        os.fchmod(fd, FILE_MODE)  # whatever the umask, and a file found with a wider mode
        self._fd, self._seq, self._size = fd, seq, os.fstat(fd).st_size
        if self._size and not _ends_a_line(path, self._size):
            self._write(b"\n")  # a line torn by a crash stays alone, unread
        sync_folder(self.folder)

    def append(self, obj: dict[str, Any]) -> None:
        """Write `obj` as one line and fsync it; rotate once the file is full. OSError as
        the file system raises it."""
        data = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
        with self._lock:
            if self._fd is None:
                raise OSError(f"the {self.stem} log is closed")
            self._write(data)
            os.fsync(self._fd)
            if self._size >= self.max_bytes:
                self._next()

    def _write(self, data: bytes) -> None:
        assert self._fd is not None
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
        self._size += len(data)

    def _next(self) -> None:
        assert self._fd is not None
        os.close(self._fd)
        self._fd = None
        self._open(self._seq + 1)
        files = numbered(self.folder, self.stem)
        for seq, path in files[:max(0, len(files) - self.keep)]:
            if self.dropping is not None:
                self.dropping(path, seq)
            path.unlink(missing_ok=True)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def _ends_a_line(path: Path, size: int) -> bool:
    with open(path, "rb") as f:
        f.seek(size - 1)
        return f.read(1) == b"\n"


def sync_folder(folder: Path) -> None:
    """A new file's name is durable too."""
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
