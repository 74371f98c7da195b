"""Why the daemon does not admit a request: typed, so the HTTP layer words them (in each
dialect's shape) and tests read their fields."""

from __future__ import annotations

from exod.facts.embed import Role


class NotAdmitted(Exception):
    """Why a request for `name` is not served."""

    instance: str | None = None  # the instance it concerns (set by Traffic.admit); None: none

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


class Unknown(NotAdmitted):
    """No instance has this name."""


class ServedElsewhere(NotAdmitted):
    """Its rank 0 runs on `host`, whose exod serves it."""

    def __init__(self, name: str, host: str) -> None:
        super().__init__(name)
        self.host = host


class NotServing(NotAdmitted):
    """Not ready, and not about to be for this request (`detail` says what it is)."""

    def __init__(self, name: str, detail: str, stopping: bool = False) -> None:
        super().__init__(name)
        self.detail = detail
        self.stopping = stopping


class Mismatch(NotAdmitted):
    """The instance serves another kind of request (`serves`: what its model is for)."""

    def __init__(self, name: str, serves: Role) -> None:
        super().__init__(name)
        self.serves = serves


class Busy(NotAdmitted):
    """`limit` requests at the runner and `queue` waiting: the most it takes."""

    def __init__(self, name: str, limit: int, queue: int) -> None:
        super().__init__(name)
        self.limit = limit
        self.queue = queue
