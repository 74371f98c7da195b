"""Discovery's one owner: the node table, the endpoint, the finders and the asking loop.

Every `cluster.interval` each endpoint a finder named (or a verified hello came from) is asked
for its signed record, by sending this node's own (exod.wire.announce). What proves the key, is
fresh (the time window, a nonce not seen, an answer to this very hello) and is newer than what
was taken of its node updates the table; anything else is a refusal: one row and one log line
per address and kind, never more, however often it comes. A member's link is timed by a probe
of PROBE_BYTES once in PROBE_EVERY.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from loguru import logger

from exod.config.schema import DEFAULT_CLUSTER_PORT, Config
from exod.core.listen import parse_listen
from exod.core.file_peers import PeerSource, choose
from exod.core.membership import Membership
from exod.core.nodes import Link, NodeInfo
from exod.core.replay import ReplayGuard
from exod.core.sizes import format_size
from exod.daemon.cluster import self_node
from exod.daemon.cluster.endpoint import Endpoint
from exod.daemon.cluster.exchange import ask
from exod.daemon.cluster.file_server import FileServer
from exod.daemon.cluster.finders import Finder, Seeds
from exod.wire import control_status as cs
from exod.wire.announce import Record, Refused, cluster_id, new_nonce, open_record, seal

PROBE_BYTES = 2**20
PROBE_EVERY = 60.0
MEASURE_EVERY = 30.0  # this node's own figures (disk, models) are measured again


@dataclass
class PeerAddress:
    """An endpoint to ask: from a finder, or where a verified hello came from."""

    host: str
    port: int
    hint: str  # the node id a finder said it has ("" unknown)
    node_id: str = ""  # the node that answered there
    is_self: bool = False
    failures: int = 0


class Discovery:
    def __init__(self, config: Config, key: bytes, ident: str, hub_folder: Path,
                 api_port: int = 0, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time,
                 serves: Callable[[], tuple[str, ...]] = tuple) -> None:
        """`serves`: the instances whose rank 0 this node runs now (announced, NodeInfo.serves)."""
        c = self.settings = config.cluster
        self.config, self.key, self.ident = config, key, ident
        self.cluster = cluster_id(key)
        self.hub_folder, self.api_port = hub_folder, api_port
        self.clock, self.wall = clock, wall
        self.serves = serves
        self.table = Membership(ident, c.peer_timeout, forget_after=max(600.0,
                                                                        10 * c.peer_timeout))
        self.replay = ReplayGuard(c.max_clock_skew)
        self.targets: dict[tuple[str, int], PeerAddress] = {}
        self.probed: dict[str, float] = {}  # node id -> when its link was last timed
        self.me = NodeInfo(ident, config.node.name, self_node.backend(), 0, 0, 0)
        self.finders: list[Finder] = []
        self.error: str | None = None
        host, port = parse_listen(c.listen)
        self.files = FileServer(key, hub_folder, c.max_clock_skew, self._refuse_file, wall)
        self.endpoint = Endpoint(host, port, self.answer, self.files.serve)
        self.bound = c.listen
        self._task: asyncio.Task[None] | None = None

    # ---- what placement reads -----------------------------------------------------------
    def members(self) -> list[NodeInfo]:
        """This node and the members heard within `peer_timeout`."""
        return [self.me, *self.table.current(self.clock())]

    def links(self) -> list[Link]:
        return self.table.links(self.clock())

    def sources(self, repo: str, commit: str | None) -> list[PeerSource]:
        """The members to ask for a hub model's files, best first (exod.core.file_peers)."""
        return choose(self.members(), self.links(), self.ident, repo, commit)

    # ---- running --------------------------------------------------------------------------
    async def start(self) -> None:
        """Listen, measure this node, start the finders and the asking loop. OSError when the
        endpoint cannot listen (the daemon does not start, as for the API)."""
        port = await self.endpoint.start()
        host, _ = parse_listen(self.settings.listen)
        self.bound = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.me = replace(await asyncio.to_thread(self._measure, port), serves=self.serves())
        self.finders = [Seeds(self.settings.peers, port or DEFAULT_CLUSTER_PORT)]
        if self.settings.mdns:
            from exod.daemon.cluster.mdns import Mdns

            self.finders.append(Mdns(self.ident, port, self.me.addresses))
        for finder in self.finders:
            try:
                await finder.start(self.found)
            except (OSError, RuntimeError, ValueError) as e:
                self.error = f"{type(finder).__name__.lower()} did not start: {e}"
                logger.error("cluster: {}; discovery goes on with the peers alone", self.error)
        logger.info("cluster {}: node {} ({}) listens on {}, announcing {}, {} of {} memory "
                    "usable, {} model(s); mDNS {}, {} seed peer(s)", self.cluster, self.ident,
                    self.me.name, self.bound, self.me.backend,
                    format_size(self.me.memory_usable), format_size(self.me.memory_total),
                    len(self.me.models), "on" if self.settings.mdns else "off",
                    len(self.settings.peers))
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for finder in self.finders:
            try:
                await finder.close()
            except (OSError, RuntimeError) as e:
                logger.debug("cluster: closing {}: {}", type(finder).__name__, e)
        await self.endpoint.close()

    def _measure(self, port: int) -> NodeInfo:
        return self_node.measure(self.config, self.hub_folder, self.ident, self.api_port, port)

    def found(self, host: str, port: int, hint: str) -> None:
        """A finder's (or a hello's) endpoint: asked from the next round on."""
        if (host, port) not in self.targets:
            self.targets[(host, port)] = PeerAddress(host, port, hint)

    async def _run(self) -> None:
        measured = self.clock()
        while True:
            if self.clock() - measured > MEASURE_EVERY:
                self.me = await asyncio.to_thread(self._measure, self.me.control_port)
                measured = self.clock()
            # Read every round (a reload, a placement changes it), not only when measured.
            self.me = replace(self.me, serves=self.serves())
            asks = [self._ask(t) for t in list(self.targets.values()) if not t.is_self]
            await asyncio.gather(*asks)
            self._tick()
            await asyncio.sleep(self.settings.interval)

    def _tick(self) -> None:
        """Members gone stale, each logged once: after every round, and before any status
        shows them (so what status shows was logged)."""
        for m in self.table.tick(self.clock()):
            logger.warning("cluster: node {} ({}) is stale: not heard for {:g}s",
                           m.info.name, m.info.node_id, self.settings.peer_timeout)

    # ---- one exchange, each side ------------------------------------------------------------
    async def _ask(self, t: PeerAddress) -> None:
        nonce = new_nonce()
        due = bool(t.node_id) and self.clock() - self.probed.get(t.node_id, -PROBE_EVERY) \
            >= PROBE_EVERY
        timeout = max(2.0, min(self.settings.interval * 2, 10.0))
        try:
            reply = await ask(t.host, t.port, self._signed(nonce, ""),
                              PROBE_BYTES if due else 0, timeout)
        except Refused as e:
            self._refuse(t.host, e.kind, e.reason, t.hint)
            return
        except OSError as e:
            t.failures += 1
            if t.failures == 1:  # once, until it answers again
                logger.info("cluster: {}:{} does not answer: {}", t.host, t.port,
                            e.strerror or e.__class__.__name__)
            return
        t.failures = 0
        if "refused" in reply.obj:
            why = str(reply.obj["refused"])[:200]
            self._refuse(t.host, "refused-by-peer", f"refused this node's announcement: {why}",
                         t.hint)
            return
        try:
            record = self._take(reply.obj.get("answer"), t.host, reply_to=nonce)
        except Refused as e:
            self._refuse(t.host, e.kind, e.reason, e.claimed or t.hint)
            return
        t.node_id = record.node.node_id
        if t.node_id == self.ident:
            t.is_self = True
        elif reply.seconds_per_mib is not None:
            self.table.measured(t.node_id, reply.seconds_per_mib)
            self.probed[t.node_id] = self.clock()

    def answer(self, signed: Any, address: str) -> dict[str, Any]:
        """The endpoint's side: a hello taken is answered with this node's record; Refused."""
        try:
            record = self._take(signed, address, reply_to="")
        except Refused as e:
            self._refuse(address, e.kind, e.reason, e.claimed)
            raise
        if record.node.node_id != self.ident and record.node.control_port:
            self.found(address, record.node.control_port, record.node.node_id)
        return self._signed(new_nonce(), record.nonce)

    def _take(self, signed: Any, address: str, reply_to: str) -> Record:
        record = open_record(signed, self.key)
        claimed = record.node.node_id
        if record.reply_to != reply_to:
            raise Refused("not-fresh", "an answer to another hello, sent again (a replay)"
                          if record.reply_to else "not an answer to this node's hello "
                          "(a hello sent again)", claimed)
        refused = self.replay.check(record.time, record.nonce, self.wall())
        if refused is not None:
            raise Refused(refused[0], refused[1], claimed)
        event = self.table.heard(record.node, record.links, record.time, address, self.clock())
        if event == "joined":
            n = record.node
            logger.info("cluster: node {} ({}) joined from {}: {}, {} of {} usable, {} "
                        "model(s)", n.name, n.node_id, address, n.backend,
                        format_size(n.memory_usable), format_size(n.memory_total),
                        len(n.models))
        elif event == "back":
            logger.info("cluster: node {} ({}) is heard again, from {}", record.node.name,
                        claimed, address)
        return record

    def _refuse(self, address: str, kind: str, reason: str, claimed: str) -> None:
        if self.table.refused(address, kind, reason, claimed, self.clock()):
            logger.warning("cluster: refused an announcement from {}{}: {}", address,
                           f" (claims {claimed[:64]!r})" if claimed else "", reason)

    def _refuse_file(self, address: str, kind: str, reason: str, claimed: str) -> None:
        """A file ask refused (exod.daemon.cluster.file_server): a row and a log line of its own
        kind, apart from the same address's refused announcements."""
        if self.table.refused(address, f"file-{kind}", reason, claimed, self.clock()):
            logger.warning("cluster: refused a file request from {}{}: {}", address,
                           f" (from {claimed[:64]!r})" if claimed else "", reason)

    def _signed(self, nonce: str, reply_to: str) -> dict[str, Any]:
        return seal(Record(self.cluster, self.me, self.wall(), nonce, self.table.own_links(),
                           reply_to), self.key)

    # ---- status -----------------------------------------------------------------------------
    def status(self) -> cs.ClusterStatus:
        self._tick()
        now = self.clock()
        nodes = [cs.ClusterNode(r.node_id, r.name, r.state.value, round(now - r.last_heard, 1),
                                r.address, r.info, r.reason or None, r.count)
                 for r in self.table.rows(now)]
        return cs.ClusterStatus(self.cluster, self.bound, self.settings.mdns,
                                list(self.settings.peers), self.me, nodes, self.links(),
                                self.error)
