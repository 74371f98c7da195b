"""A reload's prefetch (HubModels.replace_after_fetch): the new config waits on the running
instance while its model is fetched. An instance removed meanwhile leaves the download, and
the download's end then touches nothing, not even an instance added back under that name."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from exod.config.schema import Instance, StopPolicy
from exod.core.hub_ref import HubRef
from exod.core.intents import Retire
from exod.core.shards import pipeline_shards
from exod.core.states import State
from exod.daemon.downloads import Outcome
from exod.daemon.hub_models import HubModels
from exod.daemon.instance import InstanceRuntime
from tests.unit.fakes import FakeDaemon

STOP = StopPolicy(grace=10.0, drain=0.0, attempts=1, interval=5.0, kill_interval=1.0)


class Dropping(FakeDaemon):
    """Drops a retired instance, or puts its replacement in its place (as the supervisor)."""

    def retired(self, inst: InstanceRuntime, then: Retire[Any]) -> None:
        if then.replacement is None:
            del self.instances[inst.name]
        else:
            self.add(InstanceRuntime(then.replacement, pipeline_shards(4, 1), self))


class Downloads:
    def __init__(self) -> None:
        self.wants: list[tuple[HubRef, object, Callable[[Outcome], None]]] = []
        self.left: list[object] = []

    def want(self, ref: HubRef, owner: object, done: Callable[[Outcome], None],
             commit: str | None = None) -> None:
        self.wants.append((ref, owner, done))

    def leave(self, owner: object, then: Callable[[], None]) -> None:
        self.left.append(owner)
        then()


def ready(d: FakeDaemon, cfg: Instance) -> tuple[InstanceRuntime, int]:
    inst = d.add(InstanceRuntime(cfg, pipeline_shards(4, 1), d))
    inst.start()
    (pid,) = d.pids(inst)
    d.load(pid)
    assert inst.state is State.READY
    return inst, pid


def test_an_instance_removed_while_its_model_is_fetched_leaves_the_download_and_nothing_else(
        tmp_path: Path) -> None:
    d = Dropping()
    host = SimpleNamespace(
        config=SimpleNamespace(hub=SimpleNamespace(cache=tmp_path, offline=False),
                               node=SimpleNamespace(name="this-host")),
        instances=d.instances, stopping=False)
    downloads = Downloads()
    hub = HubModels(host, downloads, SimpleNamespace(reload_error=None),  # type: ignore[arg-type]
                    tmp_path, spawn=None, publish=lambda i: None)  # type: ignore[arg-type]
    cfg = Instance(name="x", model=Path("/m"), autostart=True, restart="no", stop=STOP)
    x, pid = ready(d, cfg)
    hub.replace_after_fetch("x", dataclasses.replace(cfg, hub=HubRef("org/new")))
    downloads.left.clear()
    ((_, owner, done),) = downloads.wants
    assert x.prefetch is not None

    x.stop(operator=True)
    d.exit(pid, code=0)
    x.retire(replacement=None)  # a reload removes it: a stopped instance is dropped at once
    hub.cancel_prefetch("x")
    assert "x" not in d.instances and downloads.left == [owner]

    again, _ = ready(d, dataclasses.replace(cfg, max_queue=7))  # a later reload adds x back
    (tmp_path / "snap").mkdir()
    hub._to_fetch = lambda new, old: None  # type: ignore[method-assign]
    done(Outcome(tmp_path / "snap"))
    assert d.instances["x"] is again and again.state is State.READY and again.job is None
