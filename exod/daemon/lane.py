"""One instance's request lane, held by the instance and dropped with it: its admission queue
(exod.daemon.admission), the hang watch over its streams (exod.daemon.hang), whether a start a
request asked for waits for room, and what requests read of its model's files (size,
capabilities, what it serves, Ollama's facts), each read off the loop and kept once known."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from exod.config.schema import Instance
from exod.daemon.admission import Gate
from exod.daemon.clock import Clock
from exod.daemon.hang import HangWatch
from exod.facts.caps import Capabilities, model_capabilities
from exod.facts.details import ModelFacts, model_facts
from exod.facts.embed import Role, role
from exod.facts.model_dir import model_limits

if TYPE_CHECKING:
    from exod.daemon.channel import RequestStream

ModelSize = tuple[int | None, int | None]  # (vocabulary, context window); None: unknown


class LaneOwner(Protocol):
    """What a lane reads of its instance (exod.daemon.instance), live: a hub model's config
    changes once it is fetched, and memory admission sets the width."""

    @property
    def config(self) -> Instance: ...

    @property
    def seam(self) -> Clock: ...

    @property
    def width(self) -> int: ...

    @property
    def fair(self) -> bool:
        """The runner's engine shares its batch between keys (m.ServingReport.fair)."""
        ...

    def hang(self, silent_for: float) -> None: ...


class Lane:
    def __init__(self, inst: LaneOwner) -> None:
        self.inst = inst
        self._gate = Gate(inst.width, inst.config.max_queue)
        self.watch = None if math.isinf(inst.config.hang_after) else HangWatch(
            inst.seam, inst.config.hang_after, inst.hang)  # None: hang_after is never
        self.making_room = False  # an on-demand start waits for idle instances to stop
        self._size: ModelSize | None = None  # from its config.json, read once
        self._caps: Capabilities | None = None  # from its tokenizer files, once they tell
        self._role: Role | None = None  # what its model serves, once its files are there
        self._facts: tuple[Path, ModelFacts] | None = None  # of its files, once they are there

    @property
    def gate(self) -> Gate:
        """The admission queue, at the instance's width (memory admission may widen it). An
        engine that shares its batch between keys chooses whom to start itself, so the queue
        waits there instead: `width + max_queue` at the runner, none here (docs/design/
        fair-share.md). Either way at most `max_queue` wait, and the next gets 429."""
        queue = self.inst.config.max_queue
        ahead = queue if self.inst.fair else 0
        if (self._gate.limit, self._gate.queue) != (self.inst.width + ahead, queue - ahead):
            self._gate.resize(self.inst.width + ahead, queue - ahead)
        return self._gate

    def load(self) -> tuple[int, int]:
        """(requests in the batch, requests waiting), wherever they wait."""
        width = self.inst.width
        at_runner = self._gate.active
        return min(at_runner, width), self._gate.waiting + max(0, at_runner - width)

    @property
    def busy(self) -> bool:
        """A request is at the runner or waiting for it."""
        return self._gate.active > 0 or self._gate.waiting > 0

    def refuse_waiting(self, make_error: Callable[[], BaseException]) -> None:
        """Every request waiting in the queue fails with what `make_error` makes."""
        self._gate.reject_waiting(make_error)

    def opened(self, stream: RequestStream) -> None:
        """Watch `stream` for a hang while the runner serves it (progress counts as events
        arrive, read or not), until `closed`."""
        if self.watch is not None:
            self.watch.opened(stream)
            stream.on_event = self.watch.progress

    def closed(self, stream: RequestStream) -> None:
        if self.watch is not None:
            self.watch.closed(stream)

    @contextlib.contextmanager
    def watching(self, stream: RequestStream) -> Iterator[None]:
        """`stream` watched for a hang while in this block."""
        self.opened(stream)
        try:
            yield
        finally:
            self.closed(stream)

    # ---- the model's files ---------------------------------------------------------------
    async def size(self) -> ModelSize:
        """The model's vocabulary and context window from its config.json, read once."""
        if self._size is None:
            self._size = await asyncio.to_thread(model_limits, self.inst.config.model)
        return self._size

    async def serves(self) -> Role | None:
        """What the model serves (exod.facts.embed); None while its files are not there (a
        model on the hub not fetched yet)."""
        model = self.inst.config.model  # a hub model's name until it is fetched
        if self._role is None and await asyncio.to_thread((model / "config.json").is_file):
            self._role = await asyncio.to_thread(role, model)
        return self._role

    async def capabilities(self) -> Capabilities:
        """What the model can do for a client (tools, thinking), from its tokenizer files;
        kept once they tell (a model named on the hub may not be there yet)."""
        if self._caps is None:
            caps = await asyncio.to_thread(model_capabilities, self.inst.config.model)
            if caps.tools is None:
                return caps
            self._caps = caps
        return self._caps

    async def facts(self, model_dir: Path) -> ModelFacts:
        """What Ollama's clients are told of the model's files (exod.facts.details), read
        once per folder (a hub model's folder is its snapshot)."""
        if self._facts is not None and self._facts[0] == model_dir:
            return self._facts[1]
        facts = await asyncio.to_thread(model_facts, model_dir)
        if facts.size:
            self._facts = (model_dir, facts)
        return facts
