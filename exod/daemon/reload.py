"""Reload: the config file read again (SIGHUP or `exoctl reload`), validated first, then applied
as a diff (instances added, removed, changed; the rest left alone). The supervisor holds one
`Reloader`, which counts the reloads for /metrics."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from collections.abc import Callable, Iterable
from typing import Protocol

from loguru import logger

from exod.wire import control as cm
from exod.config import ConfigError, diff, load_config
from exod.config.schema import Api, Config, Instance
from exod.daemon.front import Front
from exod.daemon.instance import InstanceRuntime


class ReloadTarget(Protocol):
    """The supervisor, as a reload sees it and changes it."""

    @property
    def config(self) -> Config: ...

    @property
    def stopping(self) -> bool: ...

    @property
    def instances(self) -> dict[str, InstanceRuntime]: ...

    @property
    def api(self) -> Front | None:
        """The HTTP API, whose tokens a reload reads again."""
        ...

    def configure(self, new: Config) -> None:
        """Take a validated config: what follows it with no restart (names, memory, ranks)."""
        ...

    def add(self, cfg: Instance) -> InstanceRuntime:
        """A new instance, not started."""
        ...


class Prefetching(Protocol):
    """The hub part's side of a reload: a changed instance's new model fetched first
    (exod.daemon.hub_models)."""

    def replace_after_fetch(self, name: str, cfg: Instance) -> None: ...

    def cancel_prefetch(self, name: str) -> None: ...

    def refetch_failed(self, names: Iterable[str]) -> None: ...


class Reloader:
    """`extend_timeout` asks the service manager for time while files are read; `reloading` and
    `reloaded` tell readiness (exod.daemon.readiness) a reload's start and its outcome (None,
    or the error STATUS shows)."""

    def __init__(self, target: ReloadTarget, hub: Prefetching,
                 extend_timeout: Callable[[float], None], reloading: Callable[[], None],
                 reloaded: Callable[[str | None], None]) -> None:
        self.target = target
        self.hub = hub
        self._extend_timeout = extend_timeout
        self._reloading = reloading
        self._reloaded = reloaded
        self.reloads = {"ok": 0, "failed": 0}
        self.config_errors = 0  # problems found by failed reloads, all told
        self._lock = asyncio.Lock()  # reloads read files in a thread: one at a time

    async def reload(self) -> cm.ReloadReply | cm.Failure:
        target = self.target
        async with self._lock:
            if target.stopping:
                return cm.Failure("exod is stopping")
            self._reloading()
            # Files are read in a thread: a slow disk or a huge file must not stall the loop.
            try:
                loop = asyncio.get_running_loop()

                def probing(seconds: float) -> None:  # from the loading thread
                    loop.call_soon_threadsafe(self._extend_timeout, seconds + 10)

                new: Config | ConfigError = await asyncio.to_thread(
                    load_config, target.config.path, probing)
            except ConfigError as e:
                new = e
            api = target.api
            if api is not None and not isinstance(new, ConfigError):
                try:
                    await api.load_keys(new.api, list(new.instances))
                except OSError as e:
                    logger.error("reload: {}; the API keeps its previous keys and tokens",
                                 e.strerror)
            return self._reload(new)

    def _reload(self, new: Config | ConfigError) -> cm.ReloadReply | cm.Failure:
        target = self.target
        if target.stopping:
            return cm.Failure("exod is stopping")
        if isinstance(new, ConfigError):
            problems = str(new).splitlines()
            for line in problems:
                logger.error("reload: {}", line)
            logger.error("reload failed: {} problem(s); nothing was changed", len(problems))
            self.reloads["failed"] += 1
            self.config_errors += len(problems)
            self._reloaded(f"reload failed ({len(problems)} problem(s)): {problems[0]}")
            return cm.Failure("invalid configuration; nothing was changed", problems)
        d = diff(target.config, new)
        if d.daemon_changed:
            logger.warning("control.socket changed: takes effect at the next restart of exod")
        if _without_keys(new.api) != _without_keys(target.config.api):
            logger.warning("api changed: takes effect at the next restart of exod")
        new = _keep_control(new, target.config)
        target.configure(new)
        # A removed or changed instance stops through the ladder, and is dropped (or replaced)
        # once every runner is gone; a reload during that stop updates the replacement.
        for name in d.removed:
            target.instances[name].retire(replacement=None)
        for name in d.removed:
            self.hub.cancel_prefetch(name)
        for name in d.changed:
            self.hub.replace_after_fetch(name, new.instances[name])
        for name in d.added:
            gone = target.instances.get(name)
            if gone is not None and gone.retiring:  # removed by an earlier reload, stopping
                gone.retire(replacement=new.instances[name])
                continue
            inst = target.add(new.instances[name])
            if inst.config.always_on:
                inst.start()
        self.hub.refetch_failed(d.unchanged)
        self.reloads["ok"] += 1
        logger.info("reloaded: {} added, {} removed, {} changed, {} unchanged",
                    len(d.added), len(d.removed), len(d.changed), len(d.unchanged))
        self._reloaded(None)
        return cm.ReloadReply(added=list(d.added), removed=list(d.removed),
                              changed=list(d.changed), unchanged=list(d.unchanged))


def _keep_control(new: Config, old: Config) -> Config:
    """The control socket and the HTTP API cannot move under a running daemon: keep the old,
    but for its keys, which a reload changes (the API read them already)."""
    return replace(new, control=old.control,
                   api=replace(old.api, keys=new.api.keys, keys_file=new.api.keys_file))


def _without_keys(api: Api) -> Api:
    return replace(api, keys=(), keys_file=None)
