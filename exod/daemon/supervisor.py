"""The daemon: one asyncio loop that owns every instance, process, socket and timer.

Lifecycle: start sockets → spawn autostart instances → READY → serve until SIGTERM/SIGINT →
run every instance's ladder → exit once no runner is alive. Signal handlers only schedule work
on the loop. SIGHUP (or `exoctl reload`) re-reads the config: validate first, then apply the
diff (its `Reloader`, exod.daemon.reload). Models named by hub repository are its `HubModels`'
(exod.daemon.hub_models). Never imports mlx: runners do that, in their own processes.
"""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from loguru import logger

from exod import __version__
from exod.wire import control_status as cs
from exod.config.schema import Api, Config, Instance
from exod.core import ladder
from exod.core.intents import Retire
from exod.core.names import Names
from exod.core.nodes import NodeInfo
from exod.core.shards import Shard, ShardError
from exod.wire import messages as m
from exod.daemon import status, zygote
from exod.daemon.commands import Commands
from exod.daemon.control import ControlServer
from exod.daemon.clock import Timer
from exod.daemon.cluster.discovery import Discovery
from exod.daemon.instance import InstanceRuntime
from exod.daemon.instance_seam import Continuation
from exod.daemon.rank import RankRuntime
from exod.daemon.launch import Launcher, plan_shards
from exod.daemon.placing import placed_config
from exod.daemon.channel import RunnerChannel
from exod.daemon.log_ring import LogRings
from exod.daemon.manager_notify import ServiceNotifier
from exod.daemon.downloads import Download, Downloads
from exod.daemon.front import Front
from exod.daemon.hub_models import HubModels
from exod.daemon.memory_check import MemoryCheck
from exod.daemon.processes import ProcessTable, RunnerHandlers
from exod.daemon.readiness import Readiness
from exod.daemon.reload import Reloader
from exod.daemon.heap import HeapTrim
from exod.daemon.traffic import Traffic
from exod.daemon.usage.keeper import UsageKeeper
from exod.daemon.manager_notify import watchdog_interval


class FrontFactory(Protocol):
    """Builds the HTTP API over this daemon (exod.cli.exod hands in exod.api's)."""

    def __call__(self, cfg: Api, daemon: Supervisor, /) -> Front: ...


class Supervisor:
    procs: ProcessTable  # made by `run`, on the running loop

    def __init__(self, config: Config, service: ServiceNotifier | None = None,
                 front: FrontFactory | None = None) -> None:
        self.config = config
        self._front = front  # builds the HTTP API, when api.listen is set
        self.names = names_of(config)
        self.service = service or ServiceNotifier()
        self.instances: dict[str, InstanceRuntime] = {}
        self.started = time.monotonic()
        self.stopping = False
        self.phase = "starting"
        self._stop_signals = 0
        self._done: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listeners: set[Callable[[InstanceRuntime], None]] = set()
        self.launcher = Launcher(config.control.socket.parent, os.environ, config.path)
        self.launcher.configure(config.instances.values())
        self.launcher.cache.claim(config.instances.values())
        self.commands = Commands(self)
        self.control = ControlServer(config.control.socket, config.control.mode, self.commands,
                                     config.control.group, config.control.max_connections)
        self.readiness = Readiness(config.ready, self.service)
        self.api: Front | None = None  # the HTTP API, when api.listen is set
        self.cluster: Discovery | None = None  # with cluster.key_file and announce
        self.logs = LogRings()
        self.memory = MemoryCheck(config.defaults.memory_headroom)
        downloads = Downloads(self, config.hub.stall_after, config.defaults.stop,
                              config.defaults.backoff)
        self.hub = HubModels(self, downloads, self.readiness, self.launcher.run_dir,
                             lambda launch, context, handlers: self.procs.spawn(
                                 launch, context, handlers), self._publish,
                             lambda repo, commit: self.cluster.sources(repo, commit)
                             if self.cluster is not None else [])
        self.reloader = Reloader(self, self.hub, self.service.extend_timeout,
                                 self.readiness.reloading,
                                 lambda error: self.readiness.reloaded(self, self.now(), error))
        self.heap = HeapTrim(self)  # freed memory back to the system, after busy minutes
        # requests: on-demand starts, idle stops, queues, hangs
        self.traffic = Traffic(self, touched=self.heap.touched)
        self.usage = UsageKeeper(config.usage)  # keys' limits, their usage and audit logs

    # ---- InstanceSeam, and DownloadSeam's clock and signals ------------------------------
    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None
        return self._loop

    def now(self) -> float:
        return self.loop.time()  # monotonic

    def call_at(self, when: float, fn: Callable[[], None]) -> Timer:
        return self.loop.call_at(when, fn)

    def admit(self, inst: InstanceRuntime) -> str | None:
        return self.memory.refuse(inst, self.instances.values())

    def missing_memory(self, inst: InstanceRuntime) -> int:
        return self.memory.missing(inst, self.instances.values())

    def prepare(self, inst: InstanceRuntime) -> None:
        inst.group_plan = self.launcher.prepare(inst.config, owner=inst, last=inst.group_plan)

    def spawn(self, inst: InstanceRuntime, rank: RankRuntime) -> int:
        launch = self.launcher.launch(inst.config, rank.shard, sum(r.local for r in inst.ranks),
                                      inst.width, inst.group_plan)
        context = {"instance": inst.name, "rank": rank.rank}
        self.heap.touched()  # a runner's start, and the exit before it, come and go in bursts
        return self.procs.spawn(launch, context, RunnerHandlers(
            on_exit=inst.on_exit, on_message=inst.on_message, on_broken=inst.on_broken))

    def ask(self, pid: int, drain: float, grace: float = 0.0) -> bool:
        return self.procs.send(pid, m.Shutdown(drain=drain, grace=grace))

    def kill(self, pid: int, sig: int) -> bool:
        return self.procs.kill(pid, sig)

    def link(self, pid: int) -> RunnerChannel | None:
        return self.procs.link(pid)

    def changed(self, inst: InstanceRuntime) -> None:
        if not inst.state.active and not inst.alive():  # no rank listens on its ports now
            self.launcher.release(inst)
        self._publish(inst)

    # ---- hub models, for instances and downloads: their seams' calls go to `hub` -------
    def cached(self, inst: InstanceRuntime) -> bool:
        return self.hub.cached(inst)

    def fetch(self, inst: InstanceRuntime) -> Download:
        return self.hub.fetch(inst)

    def unfetch(self, inst: InstanceRuntime, then: Continuation) -> None:
        self.hub.unfetch(inst, then)

    def use_model(self, inst: InstanceRuntime, path: Path) -> None:
        self.hub.use_model(inst, path)

    def spawn_fetcher(self, d: Download) -> int:
        return self.hub.spawn_fetcher(d)

    def download_changed(self, d: Download) -> None:
        self.hub.download_changed(d)

    # ---- status -----------------------------------------------------------------------------
    def listen(self, fn: Callable[[InstanceRuntime], None]) -> Callable[[], None]:
        """Call `fn` at every change of any instance; returns the function that stops it."""
        self._listeners.add(fn)
        return lambda: self._listeners.discard(fn)

    def _publish(self, inst: InstanceRuntime) -> None:
        self.traffic.changed(inst)
        # Listeners copy what they need now: a later snapshot would merge quick changes.
        for fn in list(self._listeners):
            fn(inst)
        if self._loop is not None:
            self.readiness.update(self, self.now())

    def ordered(self) -> list[InstanceRuntime]:
        return sorted(self.instances.values(), key=lambda i: i.name)

    def instance(self, name: str) -> InstanceRuntime | None:
        return self.instances.get(name)

    def cache_folder(self, inst: InstanceRuntime) -> Path | None:
        return self.launcher.cache.folder(inst.config)

    def _serves_here(self) -> tuple[str, ...]:
        """The instances whose rank 0 runs on this node: announced, so that every node of the
        cluster serves them too (docs/cluster.md, "Any node serves")."""
        return tuple(i.name for i in self.ordered() if i.served_by is None)

    def nodes(self) -> list[NodeInfo]:
        return self.cluster.members() if self.cluster is not None else []

    @property
    def node_name(self) -> str:
        return self.config.node.name

    def serving(self, name: str) -> InstanceRuntime | None:
        """The instance a request's `model` names: its own name or an alias, with or without
        a tag (exod.core.names)."""
        inst = self.instances.get(name)
        if inst is None and (target := self.names.instance(name)) is not None:
            inst = self.instances.get(target)
        return inst

    def instance_status(self, inst: InstanceRuntime) -> cs.InstanceStatus:
        return status.instance_status(inst, self.now(), self.config.defaults.stall_after)

    def summary(self) -> str:
        return status.summary(self.ordered(), self.now(), self.config.defaults.stall_after)

    def snapshot(self) -> cs.Snapshot:
        now, stall = self.now(), self.config.defaults.stall_after
        return cs.Snapshot(
            daemon=cs.DaemonStatus(
                pid=os.getpid(),
                version=__version__,
                uptime_s=round(time.monotonic() - self.started, 3),
                state=self.phase,
                config=str(self.config.path),
                control_socket=str(self.config.control.socket),
                summary=self.readiness.line(self),
                api=self.api.info() if self.api is not None else None,
                stop_worst_case_s=ladder.longest(self.config.stop_policies()),
            ),
            instances=[status.instance_status(i, now, stall) for i in self.ordered()],
            cluster=self.cluster.status() if self.cluster is not None else None,
        )

    # ---- running ------------------------------------------------------------------------
    async def run(self) -> int:
        self._loop = asyncio.get_running_loop()
        self._done = asyncio.Event()
        self.service.attach(self.loop)
        self.procs = ProcessTable(self.loop, self.logs.add)
        self.procs.install()
        try:
            await self.usage.start()
            await self.control.start()
            await self._start_api()
            await self._start_cluster()
        except (OSError, ValueError) as e:
            why = (e.strerror if isinstance(e, OSError) else None) or str(e)
            err = (e.errno if isinstance(e, OSError) else errno.EINVAL) or errno.EIO
            logger.error("cannot start: {}", why)
            self.service.errno(err, f"cannot start: {why}")
            if self.cluster is not None:
                await self.cluster.close()
            if self.api is not None:
                await self.api.close()
            await self.control.close()
            self.usage.close()
            return 1
        for sig in (signal.SIGTERM, signal.SIGINT):
            self.loop.add_signal_handler(sig, self._on_stop_signal, sig)
        self.loop.add_signal_handler(signal.SIGHUP, self._on_hup)
        self._start_watchdog()
        logger.info("exod {} pid {}: {} instance(s) from {}; stop ladder: {}", __version__,
                    os.getpid(), len(self.config.instances), self.config.path,
                    ladder.describe(self.config.defaults.stop))
        for inst_cfg in self.config.instances.values():
            self.add(inst_cfg)
        await self._start_zygote()
        if not self.stopping:  # a stop during the zygote's imports starts nothing
            for inst in self.ordered():
                if inst.config.always_on:
                    inst.start()
            self.phase = "running"
            for inst in self.ordered():  # `exoctl wait`s held for the start-up decide now
                self._publish(inst)
            self.readiness.spawned(self, self.now())
        await self._done.wait()
        if self.cluster is not None:
            await self.cluster.close()
        self.heap.close()
        if self.procs.zygote is not None:
            self.procs.zygote.close()
        if self.api is not None:
            await self.api.close()
        await self.control.close()
        self.usage.close()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            self.loop.remove_signal_handler(sig)
        logger.info("exod stopped")
        return 0

    async def _start_zygote(self) -> None:
        """Runners forked from one process that has imported what they import (on Linux, unless
        EXOD_ZYGOTE=0): started now, and waited for, if an instance starting now can use it;
        else by the first runner that can (exod.daemon.zygote)."""
        if not zygote.enabled(self.launcher.daemon_env):
            return
        z = self.procs.zygote = zygote.Zygote(self.launcher.module, self.launcher.env(None),
                                              self.launcher.run_dir)
        if not any(z.fits(self.launcher.env(i.config), self.launcher.module)
                   for i in self.instances.values() if i.config.always_on):
            return
        z.start(self.loop)
        self.service.extend_timeout(zygote.READY_WAIT + 15)  # and the runners' first spawns
        self.service.status("importing mlx-lm once, for every runner")
        await z.ready(zygote.READY_WAIT)

    async def _start_api(self) -> None:
        """The HTTP API, unless api.listen is "" (or no front was handed in)."""
        if not self.config.api.listen or self._front is None:
            return
        self.api = self._front(self.config.api, self)
        await self.api.start(list(self.config.instances))

    async def _start_cluster(self) -> None:
        """Discovery, with cluster.key_file set and cluster.announce true (docs/cluster.md)."""
        c = self.config.cluster
        if c.key_file is None or not c.announce:
            return
        from exod.daemon.cluster.self_node import node_id
        from exod.secret_file import KEY_BYTES, read_secret

        key = read_secret(c.key_file, KEY_BYTES)  # SecretFileError: an OSError saying why
        ident = node_id(self.config)
        assert ident is not None
        api_port = 0
        if self.api is not None and self.api.info().urls:
            api_port = int(self.api.info().urls[0].rsplit(":", 1)[1].rstrip("/"))
        self.cluster = Discovery(self.config, key, ident, self.hub.folder, api_port,
                                 serves=self._serves_here)
        await self.cluster.start()

    def add(self, cfg: Instance) -> InstanceRuntime:
        """A new instance, placed on its hosts, not started."""
        log = logger.bind(instance=cfg.name)
        try:
            shards = plan_shards(cfg, lambda level, text: log.log(level, "{}", text))
        except ShardError as e:  # validation should have caught it; never crash the loop
            shards = [Shard(0, 1, 0, 0, 0)]
            log.error("cannot split {}: {}", cfg.name, e)
        cfg = placed_config(cfg, shards)  # `placement: auto`: its number of ranks, decided
        inst = InstanceRuntime(cfg, shards, self)
        inst.group.place(self.config.node.name)
        self.instances[cfg.name] = inst
        return inst

    def _start_watchdog(self) -> None:
        interval = watchdog_interval()
        if interval is None:
            return

        def ping() -> None:
            # From the loop itself: a stuck loop stops pinging, and systemd notices.
            self.service.watchdog()
            self.loop.call_later(interval, ping)

        logger.info("watchdog: pinging every {:.1f}s", interval)
        ping()

    # ---- stopping -----------------------------------------------------------------------
    def _on_stop_signal(self, sig: int) -> None:
        self._stop_signals += 1
        name = signal.Signals(sig).name
        if self._stop_signals == 1:
            logger.info("{}: stopping every instance", name)
            self.begin_shutdown()
        else:
            logger.warning("{} again: skipping the remaining grace (runners are still "
                           "stopped through SIGTERM, never abandoned)", name)
            for inst in self.instances.values():
                inst.hurry()

    def begin_shutdown(self) -> None:
        self.stopping = True
        self.phase = "stopping"
        # The ladders of the instances there are (not the defaults: none may use them).
        worst = max((ladder.worst_case(i.config.stop) for i in self.instances.values()),
                    default=0.0)
        self.service.stopping(f"stopping; ladder worst case {worst:g}s")
        # Ask for more stop time than the ladder could take, should TimeoutStopSec be shorter.
        self.service.extend_timeout(worst + ladder.STOP_MARGIN)
        for inst in self.ordered():
            inst.stop()
        if self.procs.zygote is not None:
            self.procs.zygote.close()  # the start-up's wait for it, if any, ends now
        self.hub.downloads.stop_all()  # what `exoctl pull` or a reload fetches ahead
        self.loop.create_task(self._finish_shutdown())

    async def _finish_shutdown(self) -> None:
        if self.api is not None:  # no new connection; those made are answered (api.stopping)
            await self.api.stop_listening()
        await self.procs.wait_empty()
        assert self._done is not None
        self._done.set()

    # ---- reload ---------------------------------------------------------------------------
    def _on_hup(self) -> None:
        logger.info("SIGHUP: reloading {}", self.config.path)
        self.loop.create_task(self.reloader.reload())

    def configure(self, new: Config) -> None:
        """A reload's config, validated: what follows it with no restart of exod."""
        self.config = new
        self.names = names_of(new)  # aliases change with no restart (they compare equal)
        self.memory.headroom = new.defaults.memory_headroom
        self.launcher.configure(new.instances.values())
        self.launcher.cache.claim(new.instances.values())

    def retired(self, old: InstanceRuntime, then: Retire[Instance]) -> None:
        latest = then.replacement
        if latest is None:
            del self.instances[old.name]
            self.logs.forget(old.name)
            self._publish(old)
            return
        new = self.add(latest)
        if then.hold:
            new.stop(operator=True)  # the operator's stop holds the replacement too
        elif (then.restart or latest.always_on) and not self.stopping:
            new.start()
        self._publish(new)


def names_of(config: Config) -> Names:
    return Names({name: i.aliases for name, i in config.instances.items()})
