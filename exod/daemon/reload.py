"""Reload: the config file read again (SIGHUP or `exoctl reload`), validated first, then applied
as a diff (instances added, removed, changed; the rest left alone). A mixin of
`exod.daemon.supervisor.Supervisor`, kept apart so each module stays one job."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from loguru import logger

from exod.wire import control as cm
from exod.config import ConfigError, diff, load_config
from exod.config.schema import Config, Instance
from exod.core.names import Names
from exod.daemon.clock import Timer
from exod.daemon.front import Front
from exod.daemon.instance import InstanceRuntime
from exod.daemon.launch import Launcher
from exod.daemon.manager_notify import ServiceNotifier
from exod.daemon.memory_check import MemoryCheck
from exod.daemon.readiness import Readiness


class ConfigReload:
    config: Config
    names: Names
    instances: dict[str, InstanceRuntime]
    stopping: bool
    service: ServiceNotifier
    readiness: Readiness
    api: Front | None
    memory: MemoryCheck
    launcher: Launcher
    reloads: dict[str, int]
    config_errors: int
    _reload_lock: asyncio.Lock

    if TYPE_CHECKING:  # declared only: a stub here would shadow HubSeam's methods at run time
        def now(self) -> float: ...

        def call_at(self, when: float, fn: Callable[[], None]) -> Timer: ...

        def ordered(self) -> list[InstanceRuntime]: ...

        def summary(self) -> str: ...

        def _add(self, cfg: Instance) -> InstanceRuntime: ...

        def _retire(self, name: str, replacement: Instance | None) -> None: ...

        def cancel_prefetch(self, name: str) -> None: ...

        def replace_after_fetch(self, name: str, cfg: Instance) -> None: ...

        def refetch_failed(self, names: Iterable[str]) -> None: ...

    async def reload(self) -> cm.ReloadReply | cm.Failure:
        async with self._reload_lock:
            if self.stopping:
                return cm.Failure("exod is stopping")
            self.readiness.reloading()
            # Files are read in a thread: a slow disk or a huge file must not stall the loop.
            try:
                loop = asyncio.get_running_loop()

                def probing(seconds: float) -> None:  # from the loading thread
                    loop.call_soon_threadsafe(self.service.extend_timeout, seconds + 10)

                new: Config | ConfigError = await asyncio.to_thread(
                    load_config, self.config.path, probing)
            except ConfigError as e:
                new = e
            if self.api is not None and not isinstance(new, ConfigError):
                try:
                    await asyncio.to_thread(self.api.load_tokens)
                except OSError as e:
                    logger.error("reload: {}; the API keeps its previous tokens", e.strerror)
            return self._reload(new)

    def _reload(self, new: Config | ConfigError) -> cm.ReloadReply | cm.Failure:
        if self.stopping:
            return cm.Failure("exod is stopping")
        if isinstance(new, ConfigError):
            problems = str(new).splitlines()
            for line in problems:
                logger.error("reload: {}", line)
            logger.error("reload failed: {} problem(s); nothing was changed", len(problems))
            self.reloads["failed"] += 1
            self.config_errors += len(problems)
            self.readiness.reloaded(self, self.now(),
                                    f"reload failed ({len(problems)} problem(s)): {problems[0]}")
            return cm.Failure("invalid configuration; nothing was changed", problems)
        d = diff(self.config, new)
        if d.daemon_changed:
            logger.warning("control.socket changed: takes effect at the next restart of exod")
        if new.api != self.config.api:
            logger.warning("api changed: takes effect at the next restart of exod")
        new = _keep_control(new, self.config)
        self.config = new
        self.names = names_of(new)  # aliases change with no restart (they compare equal)
        self.memory.headroom = new.defaults.memory_headroom
        self.launcher.configure(new.instances.values())
        self.launcher.cache.claim(new.instances.values())
        for name in d.removed:
            self._retire(name, replacement=None)
        for name in d.removed:
            self.cancel_prefetch(name)
        for name in d.changed:
            self.replace_after_fetch(name, new.instances[name])
        for name in d.added:
            gone = self.instances.get(name)
            if gone is not None and gone.retiring:  # removed by an earlier reload, stopping
                self._retire(name, replacement=new.instances[name])
                continue
            inst = self._add(new.instances[name])
            if inst.config.always_on:
                inst.start()
        self.refetch_failed(d.unchanged)
        self.reloads["ok"] += 1
        logger.info("reloaded: {} added, {} removed, {} changed, {} unchanged",
                    len(d.added), len(d.removed), len(d.changed), len(d.unchanged))
        self.readiness.reloaded(self, self.now(), None)
        return cm.ReloadReply(added=list(d.added), removed=list(d.removed),
                              changed=list(d.changed), unchanged=list(d.unchanged))


def names_of(config: Config) -> Names:
    return Names({name: i.aliases for name, i in config.instances.items()})


def _keep_control(new: Config, old: Config) -> Config:
    """The control socket and the HTTP API cannot move under a running daemon: keep the old."""
    from dataclasses import replace

    return replace(new, control=old.control, api=old.api)
