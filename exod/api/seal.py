"""Reasoning handed to a client to send back, sealed: Responses' `encrypted_content` (with
`include: ["reasoning.encrypted_content"]`) and the `signature` of Anthropic's thinking blocks
(whose text `display: omitted` leaves out). Sent back on the next turn, a seal gives its text
back to the prompt; one exod did not make (another server's, or altered) opens to nothing, and
the dialect reports it ignored.

A seal is `exod1.` + the text (zlib, base64url) + `.` + its HMAC-SHA256 (base64url): opaque and
integrity-protected, not secret (the reasoning is the client's own answer). The key is kept in
the state directory (`reasoning.key`), so a restart loses nothing; where it cannot be kept, a
key of the process's own serves, and seals made before a restart no longer open. zlib gives
back up to a thousand times what it was given, and one request may send a seal back thousands
of times, so the seals of one request (`Seals`) together open to at most `most` bytes, what the
body could have held as plain text (api.max_body_kib): the seal that goes over is the client's
error, named. docs/api.md, "Anthropic Messages and OpenAI Responses".
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import secrets
import threading
import zlib
from pathlib import Path

from loguru import logger

from exod.core.request_rules.base import RequestError
from exod.paths import PRIVATE, make_dirs

PREFIX = "exod1."
KEY_BYTES = 32
MAX_TEXT = 64 << 20  # bytes the seals of one request open to at most, unless told otherwise


class TooLong(Exception):
    """A seal that opens to more text than it may."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Sealer:
    def __init__(self, key_file: Path | None = None, key: bytes | None = None,
                 most: int = MAX_TEXT) -> None:
        self._file = key_file
        self._key = key
        # Big bodies are read in threads (exod.api.app): the first to open a seal makes the key,
        # and the others wait for it rather than make (and keep) keys of their own.
        self._making = threading.Lock()
        self.most = most  # bytes of text the seals of one request open to, together

    @property
    def key(self) -> bytes:
        with self._making:
            if self._key is None:
                self._key = load_key(self._file) if self._file is not None \
                    else secrets.token_bytes(KEY_BYTES)
            return self._key

    def _mac(self, payload: str) -> bytes:
        return hmac.new(self.key, (PREFIX + payload).encode(), hashlib.sha256).digest()

    def seal(self, text: str) -> str:
        payload = _b64(zlib.compress(text.encode("utf-8", "surrogatepass"), 6))
        return f"{PREFIX}{payload}.{_b64(self._mac(payload))}"

    def open(self, token: object, most: int | None = None) -> str | None:
        """The text a seal holds; None when exod did not make it. Raises TooLong when that text
        is more than `most` bytes (the sealer's `most` unless given): it is unpacked no
        further."""
        opened = self._unpack(token, self.most if most is None else most)
        return None if opened is None else opened[0]

    def seals(self) -> Seals:
        """The seals of one request, to open against one budget."""
        return Seals(self)

    def _unpack(self, token: object, most: int) -> tuple[str, int] | None:
        """The text a seal holds and its size in bytes."""
        if not isinstance(token, str) or not token.startswith(PREFIX):
            return None
        payload, _, mac = token[len(PREFIX):].partition(".")
        try:
            if not hmac.compare_digest(_unb64(mac), self._mac(payload)):
                return None
            unzip = zlib.decompressobj()
            data = unzip.decompress(_unb64(payload), most + 1)  # one byte past tells "more"
            if len(data) > most:
                raise TooLong
            if unzip.unconsumed_tail or not unzip.eof:
                return None
            return data.decode("utf-8"), len(data)
        except (binascii.Error, ValueError, zlib.error):
            return None


class Seals:
    """The seals one request sends back, opened against what is left of its budget."""

    def __init__(self, sealer: Sealer) -> None:
        self.sealer = sealer
        self.left = sealer.most

    def open(self, token: object, param: str) -> str | None:
        """The text of the seal at `param` (None when exod did not make it); a RequestError
        naming it when it opens past what is left."""
        try:
            opened = self.sealer._unpack(token, self.left)
        except TooLong:
            raise RequestError(
                f"`{param}` opens to more reasoning than one request may send back: its seals "
                f"together hold at most {self.sealer.most} bytes of text, what the body could "
                "(api.max_body_kib)", param) from None
        if opened is None:
            return None
        self.left -= opened[1]
        return opened[0]


def load_key(path: Path) -> bytes:
    """The key at `path`, made (mode 0600, its folder 0700) when there is none; a key of this
    process only when the file can be neither read nor made."""
    try:
        data = path.read_bytes()
        if len(data) == KEY_BYTES:
            return data
        logger.warning("{} holds no seal key ({} bytes): a new one replaces it", path, len(data))
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as e:
        return _fallback(path, e)
    key = secrets.token_bytes(KEY_BYTES)
    try:
        make_dirs(path.parent, PRIVATE)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key)
    except FileExistsError:  # another process made it meanwhile: theirs is the key
        return load_key(path)
    except OSError as e:
        return _fallback(path, e)
    return key


def _fallback(path: Path, e: OSError) -> bytes:
    logger.warning("cannot keep the reasoning seal key in {} ({}): sealed reasoning will not "
                   "open after a restart", path, e.strerror or e)
    return secrets.token_bytes(KEY_BYTES)
