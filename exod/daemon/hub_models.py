"""Models named by hub repository, the supervisor's part in them (`HubModels`): what instances
ask through their seam (is it cached, fetch it, stop waiting) and downloads through theirs (start
a fetcher, a download changed), `exoctl pull`, and a reload that changes an instance's model
fetching the new one before the running instance is replaced."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

from loguru import logger

from exod.config.schema import Config, Instance
from exod.core.file_peers import PeerSource
from exod.core.states import State
from exod.daemon.downloads import Download, Downloads, Outcome
from exod.daemon.instance import InstanceRuntime
from exod.daemon.launch import Launch, fetcher_launch, plan_shards
from exod.daemon.processes import RunnerHandlers
from exod.daemon.readiness import Readiness
from exod.hub import cache as hub_cache
from exod.core.hub_ref import HubRef
from exod.wire import messages as m

# (repository, commit or None) -> cluster peers that hold it, best first (none: no cluster).
PeerSources = Callable[[str, str | None], list[PeerSource]]
SpawnFetcher = Callable[
    [Launch[m.FromFetcher], dict[str, object], RunnerHandlers[m.FromFetcher]], int]


class HubHost(Protocol):
    """What the hub part reads of the supervisor as it runs: a reload replaces the config and
    the instances, a shutdown sets `stopping`."""

    @property
    def config(self) -> Config: ...

    @property
    def instances(self) -> dict[str, InstanceRuntime]: ...

    @property
    def stopping(self) -> bool: ...


class HubModels:
    def __init__(self, host: HubHost, downloads: Downloads, readiness: Readiness, run_dir: Path,
                 spawn: SpawnFetcher, publish: Callable[[InstanceRuntime], None],
                 sources: PeerSources = lambda repo, commit: []) -> None:
        self.host = host
        self.downloads = downloads
        self.readiness = readiness  # a reload's model that cannot come is said in STATUS
        self.run_dir = run_dir  # fetchers run in the daemon's runtime folder
        self._spawn = spawn  # the process table's (it exists once the daemon runs)
        self._publish = publish
        self.sources = sources  # cluster peers, asked before the hub (docs/cluster.md)
        self._download_listeners: set[Callable[[Download], None]] = set()

    @property
    def config(self) -> Config:
        return self.host.config

    @property
    def instances(self) -> dict[str, InstanceRuntime]:
        return self.host.instances

    @property
    def stopping(self) -> bool:
        return self.host.stopping

    @property
    def folder(self) -> Path:
        """The hub cache's folder (hub.cache, else the environment's default one)."""
        return self.config.hub.cache or hub_cache.default_cache(os.environ, os.geteuid())

    @property
    def offline(self) -> bool:
        return self.config.hub.offline or os.environ.get("HF_HUB_OFFLINE", "").lower() in (
            "1", "true", "yes", "on")

    def cached(self, inst: InstanceRuntime) -> bool:
        """Its hub model and hub draft model, whichever it names, are in the cache, checked:
        the config now names their snapshots."""
        if inst.config.hub is not None:
            found = hub_cache.cached(self.folder, inst.config.hub)
            if found is None or not found.checked:
                return False
            hub_cache.touch(self.folder, inst.config.hub, found.commit)
            self.use_model(inst, found.path)
        if inst.config.draft_hub is not None:
            found = hub_cache.cached(self.folder, inst.config.draft_hub)
            if found is None or not found.checked:
                return False
            hub_cache.touch(self.folder, inst.config.draft_hub, found.commit)
            inst.use_draft(found.path)
        return True

    def model_dir(self, inst: InstanceRuntime) -> Path | None:
        """Where the instance's model is now: its directory, or a hub model's snapshot in the
        cache (None while it has not been fetched). Reads the cache's record: off the loop."""
        ref = inst.config.hub
        if ref is None or inst.config.model.is_dir():
            return inst.config.model
        found = hub_cache.cached(self.folder, ref)
        return found.path if found is not None else None

    def fetch(self, inst: InstanceRuntime) -> Download:
        """The model first, then the draft model (the instance calls again once the first is
        fetched)."""
        ref = inst.config.hub
        on_done: Callable[[Outcome], None] = inst.fetched
        main = hub_cache.cached(self.folder, ref) if ref is not None else None
        if ref is None or (main is not None and main.checked):
            ref = inst.config.draft_hub

            def draft_done(outcome: Outcome) -> None:
                if outcome.path is not None:
                    inst.use_draft(outcome.path)
                inst.fetched(outcome, draft=True)

            on_done = draft_done
        assert ref is not None
        return self.downloads.want(ref, inst, on_done, hub_cache.commit_of(self.folder, ref))

    def unfetch(self, inst: InstanceRuntime, then: Callable[[], None]) -> None:
        self.downloads.leave(inst, then)

    def use_model(self, inst: InstanceRuntime, path: Path) -> None:
        model = dataclasses.replace(inst.config, model=path)
        inst.use_model(path, plan_shards(model), self.config.node.name)

    def spawn_fetcher(self, d: Download) -> int:
        commit = d.commit or (d.ref.revision if d.ref.pinned else None)
        peers = tuple(self.sources(d.ref.repo, commit))
        if peers:
            logger.bind(event="download", repo=d.ref.repo).info(
                "{}: asking cluster peers first: {}", d.ref, ", ".join(p.name for p in peers))
        launch = fetcher_launch(d.ref, d.commit or None, self.folder, self.offline,
                                self.config.hub.hf_token_file, os.environ,
                                self.run_dir, peers, self.config.cluster.key_file)
        return self._spawn(launch, {"instance": f"fetch {d.ref}"},
                                RunnerHandlers(on_exit=self.downloads.on_exit,
                                               on_message=self.downloads.on_message,
                                               on_broken=self.downloads.on_broken))

    def download_changed(self, d: Download) -> None:
        for owner in list(d.waiters):
            if isinstance(owner, InstanceRuntime):
                self._publish(owner)
        for fn in list(self._download_listeners):
            fn(d)

    # ---- exoctl pull -----------------------------------------------------------------------
    def pull(self, ref: HubRef, owner: object, on_done: Callable[[Outcome], None]) -> Download:
        """Fetch `ref` ahead of time; a branch or tag is looked up again (it may have moved)."""
        return self.downloads.want(ref, owner, on_done)

    def listen_downloads(self, fn: Callable[[Download], None]) -> Callable[[], None]:
        self._download_listeners.add(fn)
        return lambda: self._download_listeners.discard(fn)

    # ---- reloads ---------------------------------------------------------------------------
    def replace_after_fetch(self, name: str, cfg: Instance) -> None:
        """A changed instance whose new model (or new draft model) is not in the cache keeps
        serving while it is fetched, and is replaced (through the ladder) once the files are
        there. When they cannot come (not on the hub, no access, no network, no disk), it keeps
        serving what it served: a reload never takes down a running instance for a model it
        cannot have. STATUS says so until a reload succeeds, and the next reload tries again."""
        self.cancel_prefetch(name)
        old = self.instances.get(name)
        ref = None if old is None or not old.state.active else self._to_fetch(cfg, old.config)
        if ref is None or old is None:
            self.instances[name].retire(replacement=cfg)
            return
        old.prefetch = cfg

        def done(outcome: Outcome) -> None:
            latest, old.prefetch = old.prefetch, None
            # Gone meanwhile (removed by a reload while stopped): nothing of it is replaced.
            if latest is None or self.stopping or self.instances.get(name) is not old:
                return
            if outcome.path is None:
                why = f"reload: {name} keeps serving its previous model: cannot fetch {ref}: " \
                      f"{outcome.error}"
                logger.bind(instance=name).error("{}", why)
                self.readiness.reload_error = why  # in STATUS, as a refused config's is
                running = self.instances.get(name)
                if running is not None:
                    self._publish(running)
                return
            self.replace_after_fetch(name, latest)  # the draft next, else replace it now

        logger.bind(instance=name).info("reload: fetching {} before replacing {}", ref, name)
        self.downloads.want(ref, ("reload", name), done, hub_cache.commit_of(self.folder, ref))

    def _to_fetch(self, new: Instance, old: Instance) -> HubRef | None:
        """The first hub repository the new config names anew that the cache lacks."""
        for ref, before in ((new.hub, old.hub), (new.draft_hub, old.draft_hub)):
            if ref is None or ref == before:
                continue
            found = hub_cache.cached(self.folder, ref)
            if found is None or not found.checked:
                return ref
        return None

    def refetch_failed(self, names: Iterable[str]) -> None:
        """Unchanged instances whose model could not be fetched (say the hub was unreachable)
        try again at a reload, as at `exoctl start`; a runner's failure is left alone."""
        for name in names:
            inst = self.instances.get(name)
            if inst is not None and inst.state is State.FAILED and inst.names_hub \
                    and inst.config.always_on and not self.cached(inst):
                inst.start(operator=True)

    def cancel_prefetch(self, name: str) -> None:
        inst = self.instances.get(name)
        if inst is not None:
            inst.prefetch = None
        # By its owner's name: the instance that asked may be gone already (a stopped one is
        # dropped at once when a reload removes it). Leaving no download just calls back.
        self.downloads.leave(("reload", name), lambda: None)
