"""The answers under way, by the secret each request sent (its digest: exod.core.keys), so that
a reload which no longer accepts a secret ends them at once: each stream gets a final
`key_revoked` error, which its dialect renders as a 401 (before the answer's head) or as its
error event (mid-stream), and the runner is told to cancel it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from exod.daemon.channel import RequestStream

REVOKED = "This key was revoked: the operator removed it from exod's keys."


class Live:
    def __init__(self) -> None:
        self.accepted: set[bytes] | None = None  # None: every secret (before keys are read)
        self._open: dict[bytes, set[RequestStream]] = {}

    @contextlib.contextmanager
    def hold(self, identity: bytes, stream: RequestStream) -> Iterator[None]:
        """While `stream` is open under `identity`. A request admitted after its key was
        revoked (it waited in a queue meanwhile) ends at once."""
        if self.accepted is not None and identity not in self.accepted:
            stream.fail("key_revoked", REVOKED)
        streams = self._open.setdefault(identity, set())
        streams.add(stream)
        try:
            yield
        finally:
            streams.discard(stream)
            if not streams and self._open.get(identity) is streams:
                del self._open[identity]

    def accept(self, identities: set[bytes]) -> int:
        """From now on only `identities`: end every stream under another; how many."""
        self.accepted = set(identities)
        ended = 0
        for identity in [i for i in self._open if i not in self.accepted]:
            for stream in list(self._open[identity]):
                stream.fail("key_revoked", REVOKED)
                ended += 1
        return ended
