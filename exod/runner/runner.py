"""What every stage of a runner's life needs, whichever kind of model it serves (text, vision,
embed): its spec, how it learns to stop, its channel and its reports; and what the kinds do
alike with them (Metal's wired memory, joining a group)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from exod.runner import wired
from exod.runner.link.channel import Channel
from exod.runner.link.lifecycle import Lifecycle
from exod.runner.link.log import log
from exod.runner.link.report import Reporter
from exod.wire.options import RunnerOptions
from exod.wire.specs import RunnerSpec

if TYPE_CHECKING:
    from exod.runner.group.membership import Group


@dataclasses.dataclass
class Runner:
    spec: RunnerSpec
    life: Lifecycle
    channel: Channel
    report: Reporter

    @property
    def options(self) -> RunnerOptions:
        return self.spec.options

    def set_wired_limit(self) -> None:
        """Metal's wired memory as the instance says (exod.runner.wired); a WiredLimitError is
        a ModelError: this model cannot be served here."""
        wired.apply(self.options.wired_limit)


def join_group(r: Runner) -> Group:
    """Join the rank's group (the spec has one): mx.distributed and the control connections."""
    from exod.runner.group.membership import connect

    spec = r.spec
    assert spec.group is not None
    g = connect(spec.shard.rank, spec.shard.world, spec.group, r.life, r.report)
    log(f"joined the group: rank {g.rank} of {g.size} ({spec.group.backend})")
    return g
