"""One disk entry of the prompt cache: a safetensors file, in the layout mlx-lm's
`save_prompt_cache` writes and `load_prompt_cache` reads (the cache's state arrays, plus its
metadata: the class of each layer's cache and which leaves were scalars), with exod's own keys
in the user part of that metadata: the entry's tokens, whether its cache can be trimmed, the
fingerprint it was made under and a CRC-32 of its data.

Pure I/O, no mlx: the tensors arrive as bytes (memoryviews of arrays already evaluated), so a
writer thread never touches mlx. A file is written to a temporary name in its folder (mode 0600)
and renamed into place: a reader sees a whole file or none. Nothing is fsynced: a file cut short
or zeroed by a power loss fails its CRC and is a miss, like any other corrupt file.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exod.runner.prompt_cache.index import TOKEN_BYTES

SUFFIX = ".safetensors"
TEMP_SUFFIX = ".tmp"
# save_prompt_cache flattens [metadata, classes, scalars]: the caller's metadata is element 0.
FORMAT, TOKENS, TRIMMABLE, FINGERPRINT, CRC = (
    f"0.exod_{k}" for k in ("format", "tokens", "trimmable", "fingerprint", "crc"))
MAX_HEADER = 64 << 20  # tokens of a long prompt are in the header: far below this
CHUNK = 8 << 20  # bytes read at a time when checking a file's CRC


class EntryError(Exception):
    """A file that cannot be an entry (cut short, corrupt, unreadable): a miss."""


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str  # safetensors' code: F32, BF16, I32, ...
    shape: tuple[int, ...]
    data: memoryview  # C-contiguous bytes

    @property
    def nbytes(self) -> int:
        return self.data.nbytes


@dataclass(frozen=True)
class Header:
    tensors: dict[str, dict[str, Any]]
    metadata: dict[str, str]
    data_start: int
    size: int  # the whole file's

    @property
    def tokens(self) -> bytes:
        return base64.b64decode(self.metadata[TOKENS])

    @property
    def trimmable(self) -> bool:
        return self.metadata.get(TRIMMABLE) == "1"


def exod_metadata(tokens: bytes, trimmable: bool, fingerprint: str,
                  version: int) -> dict[str, str]:
    return {FORMAT: str(version), TOKENS: base64.b64encode(tokens).decode(),
            TRIMMABLE: "1" if trimmable else "0", FINGERPRINT: fingerprint}


def header(tensors: Sequence[Tensor], metadata: Mapping[str, str]) -> bytes:
    """The file's header for these tensors (a pass over their bytes for the CRC)."""
    crc, offset, described = 0, 0, {}
    for t in tensors:
        crc = zlib.crc32(t.data, crc)
        described[t.name] = {"dtype": t.dtype, "shape": list(t.shape),
                             "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    described["__metadata__"] = {**metadata, CRC: f"{crc:08x}"}
    raw = json.dumps(described, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # safetensors pads its header to 8 bytes
    return struct.pack("<Q", len(raw)) + raw


def size(head: bytes, tensors: Sequence[Tensor]) -> int:
    return len(head) + sum(t.nbytes for t in tensors)


def write(folder: Path, name: str, head: bytes, tensors: Sequence[Tensor]) -> int:
    """Write the entry `name` into `folder` atomically; its size in bytes. OSError as the
    system raised it (a full disk, a folder gone or unwritable): no temporary file is left."""
    tmp = folder / f".{name}.{secrets.token_hex(4)}{TEMP_SUFFIX}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(head)
            for t in tensors:
                f.write(t.data)
        os.replace(tmp, folder / name)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return size(head, tensors)


def read_header(path: Path) -> Header:
    """An entry's header, checked for what exod needs of it; EntryError if it is not one."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                raise EntryError("shorter than a header")
            (n,) = struct.unpack("<Q", head)
            if n > min(MAX_HEADER, size - 8):
                raise EntryError(f"header of {n} bytes in a file of {size}")
            raw = f.read(n)
        obj = json.loads(raw)
    except OSError as e:
        raise EntryError(f"unreadable: {e.strerror or e}") from e
    except (ValueError, UnicodeDecodeError) as e:
        raise EntryError(f"header is not JSON: {e}") from e
    if not isinstance(obj, dict) or not isinstance(obj.get("__metadata__"), dict):
        raise EntryError("header without metadata")
    meta = obj.pop("__metadata__")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()) \
            or TOKENS not in meta or CRC not in meta:
        raise EntryError("not an exod entry (its metadata lacks tokens or CRC)")
    end = max((_end(v) for v in obj.values()), default=0)
    if 8 + n + end != size:
        raise EntryError(f"{size} bytes where its header describes {8 + n + end}")
    header = Header(obj, meta, 8 + n, size)
    try:
        tokens = header.tokens
    except ValueError as e:
        raise EntryError(f"its tokens do not decode: {e}") from e
    if not tokens or len(tokens) % TOKEN_BYTES:
        raise EntryError("its tokens do not decode")
    return header


def verify(path: Path, header: Header) -> None:
    """Read the whole file: its data must have the CRC its header holds (EntryError)."""
    crc = 0
    try:
        with open(path, "rb") as f:
            f.seek(header.data_start)
            while chunk := f.read(CHUNK):
                crc = zlib.crc32(chunk, crc)
            if f.tell() != header.size:
                raise EntryError("changed while read")
    except OSError as e:
        raise EntryError(f"unreadable: {e.strerror or e}") from e
    if f"{crc:08x}" != header.metadata[CRC]:
        raise EntryError("its data does not match its CRC (corrupt)")


def _end(tensor: Any) -> int:
    try:
        start, end = tensor["data_offsets"]
        if not (isinstance(start, int) and isinstance(end, int) and 0 <= start <= end):
            raise ValueError
    except (TypeError, ValueError, KeyError) as e:
        raise EntryError("a tensor without valid data offsets") from e
    return end
