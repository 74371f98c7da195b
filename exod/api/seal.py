"""Reasoning handed to a client to send back, sealed: Responses' `encrypted_content` (with
`include: ["reasoning.encrypted_content"]`) and the `signature` of Anthropic's thinking blocks
(whose text `display: omitted` leaves out). Sent back on the next turn, a seal gives its text
back to the prompt; one exod did not make (another server's, or altered) opens to nothing, and
the dialect reports it ignored.

A seal is `exod1.` + the text (zlib, base64url) + `.` + its HMAC-SHA256 (base64url): opaque to
clients and integrity-protected, not secret (the reasoning is the client's own answer). The key
is 32 random bytes in the state directory (`reasoning.key`, mode 0600), made on first use and
kept across restarts, so a restart loses nothing; where it cannot be kept, a key of the
process's own serves, and seals made before a restart no longer open.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import secrets
import zlib
from pathlib import Path

from loguru import logger

PREFIX = "exod1."
KEY_BYTES = 32
MAX_TEXT = 64 << 20  # bytes a seal opens to at most: the text of one context window's worth


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Sealer:
    def __init__(self, key_file: Path | None = None, key: bytes | None = None) -> None:
        self._file = key_file
        self._key = key

    @property
    def key(self) -> bytes:
        if self._key is None:
            self._key = load_key(self._file) if self._file is not None \
                else secrets.token_bytes(KEY_BYTES)
        return self._key

    def _mac(self, payload: str) -> bytes:
        return hmac.new(self.key, (PREFIX + payload).encode(), hashlib.sha256).digest()

    def seal(self, text: str) -> str:
        payload = _b64(zlib.compress(text.encode("utf-8", "surrogatepass"), 6))
        return f"{PREFIX}{payload}.{_b64(self._mac(payload))}"

    def open(self, token: object) -> str | None:
        """The text a seal holds; None when exod did not make it."""
        if not isinstance(token, str) or not token.startswith(PREFIX):
            return None
        payload, _, mac = token[len(PREFIX):].partition(".")
        try:
            if not hmac.compare_digest(_unb64(mac), self._mac(payload)):
                return None
            unzip = zlib.decompressobj()
            data = unzip.decompress(_unb64(payload), MAX_TEXT)
            if unzip.unconsumed_tail or not unzip.eof:
                return None
            return data.decode("utf-8")
        except (binascii.Error, ValueError, zlib.error):
            return None


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
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
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
