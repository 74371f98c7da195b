"""What an instance needs of the daemon (exod.daemon.instance): the one seam its logic reaches
the OS, the clock and the other parts through, so unit tests drive it with a fake one. Generic
in the instance (`Inst`), so that this module needs no import of the instance's."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

from exod.config.schema import Instance
from exod.core.intents import Retire
from exod.daemon.rank import RankRuntime, RankSeam

if TYPE_CHECKING:
    from exod.daemon.downloads import Download

Continuation = Callable[[], None]
Inst = TypeVar("Inst", contravariant=True)  # the instance: exod.daemon.instance


class InstanceSeam(RankSeam, Protocol[Inst]):
    """What an instance needs of the daemon: its runners' processes (the ranks' seam), memory
    admission, the group's files, hub models, and where its status and its end are reported."""

    def admit(self, inst: Inst) -> str | None:
        """Why this host cannot start `inst` now (memory), or None to go ahead."""
        ...

    def prepare(self, inst: Inst) -> None:
        """A group is about to start: agree on its addresses (e.g. write the hostfile)."""
        ...

    def spawn(self, inst: Inst, rank: RankRuntime) -> int:
        """Start the runner for `rank`; returns its pid; raises OSError when exec fails."""
        ...

    def changed(self, inst: Inst) -> None:
        """State or progress changed: refresh status, wake waiters."""
        ...

    def cached(self, inst: Inst) -> bool:
        """A hub model is in the cache, checked: `inst.config.model` now names its snapshot."""
        ...

    def fetch(self, inst: Inst) -> Download:
        """Fetch a hub model (sharing a download in progress); `inst.fetched` is called when
        it is done, with the snapshot or the reason it cannot be fetched."""
        ...

    def unfetch(self, inst: Inst, then: Continuation) -> None:
        """`inst` no longer waits for its download; `then` once no fetcher runs for it."""
        ...

    def use_model(self, inst: Inst, path: Path) -> None:
        """The model's files are at `path`: plan the ranks from its config.json."""
        ...

    def retired(self, inst: Inst, then: Retire[Instance]) -> None:
        """`inst` is stopped for a reload: drop it, or put `then.replacement` in its place."""
        ...
