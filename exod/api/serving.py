"""The generation path of the HTTP API: ask the daemon once for a lease on the instance
(exod.daemon.traffic, exod.daemon.lease: on-demand start, admission queue, hang watch), send
the request on rank 0's link, and relay the events back, whole or as SSE. Every request is metered
(exod.api.metrics). The daemon's refusals become errors in OpenAI's shape here.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from typing import TYPE_CHECKING

from aiohttp import web
from loguru import logger

from exod.wire import messages as m
from exod.api.accounting import Account, accounted
from exod.api.access import KEY_ID, check_instance, key_of
from exod.api.errors import (ApiError, bad_request, model_not_found, not_ready, queue_full,
                             runner_error, served_elsewhere, serves_other)
from exod.api.ignored import header
from exod.api.image_fetch import Fetcher
from exod.api.live import Live
from exod.api.metrics import Meter, Metrics
from exod.api.output import DialectOutput
from exod.api.reply import Deltas, Whole
from exod.api.request import GenRequest, ModelLimits, apply_limits, with_template_defaults
from exod.api.view import DaemonView
from exod.core.keys import ApiKey
from exod.core.images import REQUEST_MEGAPIXELS, pixel_problem, unseen
from exod.core.system_lines import drop_system_lines
from exod.core.sizes import format_size
from exod.daemon.channel import RequestStream, TooLarge
from exod.daemon.lease import Lease
from exod.daemon.refusals import Busy, Mismatch, NotAdmitted, NotServing, ServedElsewhere
from exod.daemon.traffic import Vet
from exod.facts.embed import Role
from exod.wire.protocol import MAX_FRAME

if TYPE_CHECKING:
    from exod.daemon.instance import InstanceRuntime

Limits = Callable[["InstanceRuntime"], Awaitable[ModelLimits]]
# A dialect's last word on its request, from what the instance's model can do (Ollama's suffix
# and think), before the daemon starts anything for it: it raises to refuse.
Adapt = Callable[["InstanceRuntime", GenRequest], Awaitable[GenRequest]]


def refusal(e: NotAdmitted) -> ApiError:
    """The daemon's reason not to serve a request, as the client reads it."""
    if isinstance(e, NotServing):
        return not_ready(e.name, e.detail, e.stopping)
    if isinstance(e, Busy):
        return queue_full(e.name, e.limit, e.queue)
    if isinstance(e, ServedElsewhere):
        return served_elsewhere(e.name, e.host)
    if isinstance(e, Mismatch):
        return serves_other(e.name, e.serves)
    return model_not_found(e.name)


def without_system_lines(req: GenRequest, prefixes: tuple[str, ...]) -> GenRequest:
    """A chat request without the system prompt's lines the instance drops
    (`drop_system_lines`, exod.core.system_lines)."""
    if req.gen.kind != "chat" or not prefixes or not req.gen.messages:
        return req
    messages = drop_system_lines(req.gen.messages, prefixes)
    return req if messages is req.gen.messages else replace(
        req, gen=replace(req.gen, messages=messages))


class Serving:
    def __init__(self, sup: DaemonView, fetcher: Fetcher,
                 megapixels: int = REQUEST_MEGAPIXELS) -> None:
        """`megapixels`: the pixels a request's pictures may have together, in millions
        (api.max_request_megapixels)."""
        self.sup = sup
        self.traffic = sup.traffic
        self.metrics = Metrics(sup, lambda inst: inst.lane.load())
        self.fetcher = fetcher
        self.megapixels = megapixels
        self.live = Live()  # the answers under way, by key: a reload may revoke one

    # ---- one request ------------------------------------------------------------------------
    async def generate(self, request: web.Request, req: GenRequest, limits: Limits,
                       out: DialectOutput, keep_alive: float | None = None,
                       adapt: Adapt | None = None, dialect: str = "chat"
                       ) -> web.StreamResponse:
        """Serve one request; `out`: the dialect its answer is rendered in (exod.api.output,
        exod.api.dialects); `keep_alive`: the idle window it asks for once it ends (Ollama's,
        exod.core.keep_alive); `adapt`: the dialect's last word on the request, from what
        the model can do, before the daemon starts anything for it. Its key's limits let it
        in or refuse it first, before anything starts (exod.api.accounting)."""
        account = Account(self.sup.usage, key_of(request), dialect, req.model,
                          counts=not req.gen.count_only)
        with self.metered() as meter:
            async with accounted(account) as outcome:
                resp = await self._admitted(request, req, meter, limits, out, keep_alive,
                                            adapt, account)
                meter.status = resp.status
                # A stream that failed after its 200 head is recorded by its failure.
                outcome.status = meter.failed_code if resp.status == 200 and meter.failed_code \
                    else resp.status
                return resp

    @contextlib.contextmanager
    def metered(self) -> Iterator[Meter]:
        """A request, counted by its status once it ends (set `meter.status` to the answer's;
        a client that left is 499) for the instance it is labelled with."""
        meter = self.metrics.meter()
        try:
            yield meter
        except ApiError as e:
            meter.status = e.status
            raise
        except Exception:
            meter.status = 500
            raise
        finally:
            meter.finish(meter.status)

    async def admit(self, req_model: str, wants: Role | None, meter: Meter,
                    keep_alive: float | None, key: ApiKey, vet: Vet | None = None) -> Lease:
        """The daemon's one answer to a request: a lease, or its refusal worded (ApiError);
        either way `meter` is labelled with the instance it concerns. `key`: the request's,
        which may not see every instance. `vet`: exod.daemon.traffic.Vet."""
        inst = self.sup.serving(req_model)
        check_instance(key, None if inst is None else inst.name, req_model)
        try:
            lease = await self.traffic.admit(req_model, wants, keep_alive, vet)
        except NotAdmitted as e:
            meter.label(e.instance)
            raise refusal(e) from None
        meter.label(lease.instance.name)
        return lease

    async def _admitted(self, request: web.Request, req: GenRequest, meter: Meter,
                        limits: Limits, out: DialectOutput, keep_alive: float | None,
                        adapt: Adapt | None, account: Account) -> web.StreamResponse:
        adapted = req

        async def vet(inst: InstanceRuntime) -> None:
            nonlocal adapted
            if adapt is not None:
                adapted = await adapt(inst, req)

        lease = await self.admit(req.model, "chat", meter, keep_alive, key_of(request), vet)
        inst, req = lease.instance, adapted
        account.instance = inst.name
        req = await self._pictures(lease, req)
        req = apply_limits(req, await limits(inst))
        req = with_template_defaults(req, inst.config.chat_template_kwargs)
        req = without_system_lines(req, inst.config.drop_system_lines)
        try:
            async with lease:
                try:
                    stream = lease.open(keyed(req.gen, key_of(request)))
                except TooLarge as e:
                    raise too_large_for_runner(req, e.size) from None
                with self.live.hold(request.get(KEY_ID, b""), stream):
                    return await self._relay(request, req, stream, meter, out, account)
        except NotAdmitted as e:
            raise refusal(e) from None

    async def _pictures(self, lease: Lease, req: GenRequest) -> GenRequest:
        """A request's pictures: refused for a model known not to see (the runner refuses them
        too, when its files do not tell yet), else their URLs fetched (outside any slot: the
        runner's place is not held while a picture downloads), then their pixels together
        read from their headers, and refused past api.max_request_megapixels before the
        request takes a place in a queue or the runner decodes any of them."""
        if not req.pictures:
            return req
        if (await lease.capabilities()).vision is False:
            where = req.pictures[0].where
            raise bad_request(unseen(lease.instance.name, where), where)
        req = await self.fetcher.resolve(req)
        problem = pixel_problem(req.pictures, self.megapixels)
        if problem is not None:
            raise bad_request(*problem, code="image_too_large")
        return req

    async def _relay(self, request: web.Request, req: GenRequest, stream: RequestStream,
                     meter: Meter, out: DialectOutput, account: Account
                     ) -> web.StreamResponse:
        # Closed here, when the answer is: left to the garbage collector, an unfinished async
        # generator costs the event loop a wake-up and a task of its own to close it.
        try:  # watched for a hang by the lease
            async with contextlib.aclosing(_events(stream, meter, out, account)) as events:
                if req.stream:
                    return await _stream(request, req, events, meter, out, account)
                return await _whole(req, events, out, account)
        finally:
            stream.close()  # cancels the generation unless it finished


async def _events(stream: RequestStream, meter: Meter, out: DialectOutput,
                  account: Account) -> AsyncGenerator[m.Event, None]:
    """Every event of the request (progress for the hang watch is counted as they arrive)."""
    while True:
        ev = await stream.next()
        meter.event(ev)
        account.event(ev)
        out.seen(ev)
        yield ev


async def _after(first: m.Event, rest: AsyncIterator[m.Event]
                 ) -> AsyncGenerator[m.Event, None]:
    yield first
    async for ev in rest:
        yield ev


def keyed(gen: m.Generate, key: ApiKey) -> m.Generate:
    """The request as the runner's engine shares its batch: whose it is, with the key's weight
    and priority (exod.runner.serving.fair_share)."""
    return replace(gen, key=key.name, weight=key.weight,
                   priority="batch" if key.priority == "batch" else "interactive")


def too_large_for_runner(req: GenRequest, size: int) -> ApiError:
    param = req.gen.named("messages") if req.gen.kind == "chat" else "prompt"
    return ApiError(413, f"The request is {size} bytes once encoded for the runner, more than "
                         f"the {format_size(MAX_FRAME)} a runner takes: shorten `{param}`.",
                    "invalid_request_error", "request_too_large", param)


async def _whole(req: GenRequest, events: AsyncIterator[m.Event], out: DialectOutput,
                 account: Account) -> web.Response:
    deltas, whole = Deltas(), Whole()
    async for ev in events:
        if isinstance(ev, (m.Prefill, m.Held, m.Vectors)):
            continue  # progress only (see _events); no Vectors for a generation
        if isinstance(ev, m.Error):
            raise runner_error(ev)
        reply = whole.add(deltas.of(ev))
        if reply is not None:
            await account.finish(200)  # its record on disk before the client has the answer
            return web.json_response(out.whole(reply), headers=header(req.ignored))
    raise AssertionError("unreachable: the event stream never ends")


async def _stream(request: web.Request, req: GenRequest, events: AsyncIterator[m.Event],
                  meter: Meter, out: DialectOutput, account: Account) -> web.StreamResponse:
    # The runner checks a request against the model when it takes it: its refusal is the first
    # event, and becomes the answer's status (a 400 naming the field), before any header.
    first = await anext(events)
    while isinstance(first, m.Prefill) and first.total == 0:  # still being read (m.Prefill)
        first = await anext(events)
    if isinstance(first, m.Error):
        raise runner_error(first)
    resp = web.StreamResponse(headers={**out.stream_headers, **header(req.ignored)})
    deltas = Deltas()
    last = b""
    try:
        await resp.prepare(request)
        await resp.write(out.begin())
        async with contextlib.aclosing(_after(first, events)) as rest:
            async for ev in rest:
                if isinstance(ev, (m.Prefill, m.Held, m.Vectors)):
                    continue  # progress only (see _events); no Vectors for a generation
                if isinstance(ev, (m.Text, m.ToolCall)):
                    await resp.write(out.delta(deltas.of(ev)))
                    continue
                if isinstance(ev, m.Done):
                    last = out.delta(deltas.of(ev))
                    await account.finish(200)  # on disk before the stream's end is sent
                else:
                    err = runner_error(ev)
                    meter.failed_code = err.status
                    logger.bind(instance=req.model).warning("stream ended by an error: {}",
                                                            err.message)
                    last = out.failed(err)
                break
        # The end, its marker and the body's end in one write: one wake-up of the client.
        await resp.write_eof(last + out.end())
    except ConnectionError:
        meter.failed_code = 499  # the client left; the caller's `stream.close()` cancels
    return resp
