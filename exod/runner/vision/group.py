"""A model that sees, split across the ranks of a pipeline group: the vision tower runs on rank 0
only (as mlx-vlm's and exo's designs have it), the language model's layers are split as a text
model's are (exod.runner.split.pipeline), and every rank runs the same vision engine in step
(exod.runner.group.lockstep).

What differs from text: a request is not replayed when rank 0 admits it but when rank 0 puts
it into its generator, seen (its pictures through the tower, a step of its own) and released
(exod.runner.vision.engine: with the rest of a burst), as a `See` (exod.runner.group.
plan): its tokens, the embeddings' shape and the features the language model reads besides
them (Qwen's M-RoPE positions), never its pictures. Another rank puts zeros of that shape in
the embeddings' place: its first own layer takes the previous rank's hidden state instead. A
request rank 0 has admitted but not seen yet is unknown elsewhere (a cancel of it is a no-op
there), and so is one seen and held.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import mlx.core as mx

from exod.wire import messages as m
from exod.core import images
from exod.runner.group.lockstep import LeaderEngine, follow, seeded
from exod.runner.failures import PeerLost
from exod.runner.group.membership import Group
from exod.runner.group.plan import Ints, See, Settings
from exod.runner.link.lifecycle import Lifecycle
from exod.runner.serving.reading import Prompt
from exod.runner.vision.engine import VisionEngine
from exod.runner.vision.request import Shipped


class NotShippable(Exception):
    """A feature of a request another rank cannot be given (not an integer array)."""


class VisionLeader(LeaderEngine):
    """Rank 0: its vision engine, each request recorded once seen (see the module)."""

    engine: VisionEngine

    def __init__(self, engine: VisionEngine, group: Group) -> None:
        super().__init__(engine, group)
        engine.leads = True  # each step below takes what it ships

    def admit(self, req: m.Generate, prompt: Prompt) -> None:
        self.engine.admit(seeded(req), prompt)  # recorded once seen

    def step(self) -> list[m.Event]:
        events = self.engine.release()  # as VisionEngine.step, each one put in recorded
        shipped, self.engine.shipped = self.engine.shipped, []
        for one in shipped:
            try:
                self._record(see(one, self.engine.request(one.rid)))
            except NotShippable as e:
                self.engine.cancel(one.rid)
                events.append(m.Error(one.rid, "bad_request", str(e)))
        events += self.engine.see_next()
        if self.engine.gathering:  # the generator waits for the next one (see its doc)
            self.flush()
            return events
        self.flush(step=True)
        failed = self.engine.failed_steps
        events += self.engine.advance()
        if self.engine.failed_steps != failed:
            raise PeerLost("a batch step failed on rank 0 (see above); the group restarts to "
                           "be in step again")
        return events


def see(shipped: Shipped, req: m.Generate) -> See:
    """The `See` of a request: its pictures left out of it (the tokens stand for them)."""
    embeds = shipped.features["inputs_embeds"]
    features = {k: _ints(k, v) for k, v in shipped.features.items() if k != "inputs_embeds"}
    bare = dataclasses.replace(req, images=[], messages=[
        {**msg, "content": images.text_of(msg["content"])} for msg in req.messages or []]
        if req.messages is not None else None)
    return See(bare, shipped.tokens, shipped.pictures, int(embeds.shape[-1]),
               str(embeds.dtype).removeprefix("mlx.core."), features, shipped.cached)


def _ints(name: str, value: Any) -> Ints:
    if not isinstance(value, mx.array) or value.dtype not in (mx.int32, mx.int64, mx.uint32):
        raise NotShippable(f"this model's `{name}` cannot be sent to the other ranks of a "
                           "group: serve it with shards: 1")
    flat: Any = value.reshape(-1).tolist()
    return Ints(list(value.shape), [int(x) for x in flat],
                str(value.dtype).removeprefix("mlx.core."))  # type: ignore[arg-type]


def follow_vision(make: Callable[[Settings], VisionEngine], group: Group,
                  life: Lifecycle) -> None:
    """Ranks 1..N-1: replay rank 0's plans on a vision engine (`make(settings)`)."""
    follow(None, None, group, life, make=make)
