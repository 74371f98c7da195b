"""The generation path of the HTTP API: find the instance (starting it when it is on demand),
pass its admission gate, send the request to rank 0's runner, and relay the events back, whole
or as SSE. Every request is metered (exod.api.metrics) and watched for hangs (exod.api.hang).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web
from loguru import logger

from exod import messages as m
from exod.api.admission import Gate, QueueFull
from exod.api.errors import (ApiError, model_not_found, not_ready, queue_full, runner_error,
                             served_elsewhere)
from exod.api.hang import HangWatch
from exod.api.metrics import Meter, Metrics
from exod.api.dialects.output import OpenAiOutput, Output
from exod.api import sse
from exod.api.objects import Reply
from exod.api.on_demand import OnDemand, Stopped
from exod.api.tool_output import streamed_call, whole_call
from exod.api.schema import GenRequest, ModelLimits, apply_limits, with_template_defaults
from exod.api.view import Daemon
from exod.core.states import State
from exod.daemon.channel import RequestStream, TooLarge
from exod.protocol import MAX_FRAME

if TYPE_CHECKING:
    import asyncio

    from exod.daemon.instance import InstanceRuntime

Limits = Callable[["InstanceRuntime"], Awaitable[ModelLimits]]


class Serving:
    def __init__(self, sup: Daemon, loop: asyncio.AbstractEventLoop) -> None:
        self.sup = sup
        self.loop = loop
        self.gates: weakref.WeakKeyDictionary[InstanceRuntime, Gate] = \
            weakref.WeakKeyDictionary()
        self.watches: weakref.WeakKeyDictionary[InstanceRuntime, HangWatch] = \
            weakref.WeakKeyDictionary()
        self.metrics = Metrics(sup, self.gates.get)
        self.on_demand = OnDemand(sup, loop, self.gates.get)

    def instance_changed(self, inst: InstanceRuntime) -> None:
        """Requests queued for an instance that can no longer serve them get a 503."""
        gate = self.gates.get(inst)
        if gate is not None and self.on_demand.gives_up(inst):
            gate.reject_waiting(lambda: not_ready(inst.name, inst.state.value,
                                                  inst.state is State.STOPPING))
        if inst.state is State.READY and inst.config.on_demand:
            self.on_demand.used(inst)  # the idle clock starts once it is ready

    def gate(self, inst: InstanceRuntime) -> Gate:
        gate = self.gates.get(inst)
        if gate is None:
            gate = self.gates[inst] = Gate(inst.width, inst.config.max_queue)
        elif gate.limit != inst.width:
            gate.resize(inst.width)
        return gate

    def _watch(self, inst: InstanceRuntime) -> HangWatch | None:
        if math.isinf(inst.config.hang_after):
            return None
        watch = self.watches.get(inst)
        if watch is None:
            watch = self.watches[inst] = HangWatch(self.loop, inst.config.hang_after, inst.hang)
        return watch

    def _instance(self, name: str) -> InstanceRuntime:
        inst = self.sup.instance(name)
        if inst is None:
            raise model_not_found(name)
        if inst.served_by is not None:
            raise served_elsewhere(name, inst.served_by)
        if inst.state is not State.READY:
            if not inst.config.on_demand:
                raise not_ready(name, inst.state.value, inst.state is State.STOPPING)
            self.on_demand.ensure_started(inst)
            if self.on_demand.gives_up(inst):
                raise not_ready(name, inst.machine.reason or inst.state.value)
        return inst

    # ---- one request ------------------------------------------------------------------------
    async def generate(self, request: web.Request, req: GenRequest, limits: Limits,
                       out: Output | None = None) -> web.StreamResponse:
        """Serve one request; `out`: the dialect its answer is rendered in (OpenAI's chat
        completions by default, see exod.api.dialects)."""
        known = self.sup.instance(req.model) is not None  # no label for any name a client sends
        meter = self.metrics.meter(req.model)
        status = 499  # the client left (its handler was cancelled)
        try:
            resp = await self._admitted(request, req, meter, limits, out or OpenAiOutput())
            status = resp.status
            return resp
        except ApiError as e:
            status = e.status
            raise
        except Exception:
            status = 500
            raise
        finally:
            if known:
                meter.finish(status)

    async def _admitted(self, request: web.Request, req: GenRequest, meter: Meter,
                        limits: Limits, out: Output) -> web.StreamResponse:
        inst = self._instance(req.model)
        req = apply_limits(req, await limits(inst))
        req = with_template_defaults(req, inst.config.chat_template_kwargs)
        gate = self.gate(inst)
        try:
            await gate.enter()
        except QueueFull:
            raise queue_full(inst.name, gate.limit, gate.queue) from None
        try:
            try:  # an on-demand instance may still be loading: wait for it, in the queue
                await self.on_demand.until_ready(inst)
            except Stopped as e:
                raise not_ready(inst.name, inst.machine.reason or str(e)) from None
            # Waiting may have taken a while: ready still, and the very same instance?
            if self.sup.instance(req.model) is not inst or inst.state is not State.READY:
                raise not_ready(inst.name, "replaced by a reload")
            link = inst.serving_link()
            if link is None:
                raise not_ready(inst.name, "its runner is gone")
            try:
                stream = link.open(req.gen)
            except TooLarge as e:
                raise too_large_for_runner(req, e.size) from None
            return await self._relay(request, req, inst, stream, meter, out)
        finally:
            gate.leave()
            if inst.config.on_demand:
                self.on_demand.used(inst)

    async def _relay(self, request: web.Request, req: GenRequest, inst: InstanceRuntime,
                     stream: RequestStream, meter: Meter, out: Output) -> web.StreamResponse:
        watch = self._watch(inst)
        if watch is not None:
            watch.opened(stream)
            stream.on_event = watch.progress  # as events arrive, read or not
        try:
            events = _events(stream, meter, out)
            if req.stream:
                return await _stream(request, req, events, meter, out)
            return await _whole(req, events, out)
        finally:
            if watch is not None:
                watch.closed(stream)
            stream.close()  # cancels the generation unless it finished


async def _events(stream: RequestStream, meter: Meter, out: Output) -> AsyncIterator[m.Event]:
    """Every event of the request (progress for the hang watch is counted as they arrive)."""
    while True:
        ev = await stream.next()
        meter.event(ev)
        out.seen(ev)
        yield ev


async def _after(first: m.Event, rest: AsyncIterator[m.Event]) -> AsyncIterator[m.Event]:
    yield first
    async for ev in rest:
        yield ev


def too_large_for_runner(req: GenRequest, size: int) -> ApiError:
    param = "messages" if req.gen.kind == "chat" else "prompt"
    return ApiError(413, f"The request is {size} bytes once encoded for the runner, more than "
                         f"the {MAX_FRAME >> 20} MiB a runner takes: shorten `{param}`.",
                    "invalid_request_error", "request_too_large", param)


def _param(req: GenRequest, ev: m.Error) -> str | None:
    """The field a runner named, as the client spelled it (`max_completion_tokens`...)."""
    if ev.param == "max_tokens" and req.max_tokens_param is not None:
        return req.max_tokens_param
    return ev.param


async def _whole(req: GenRequest, events: AsyncIterator[m.Event], out: Output) -> web.Response:
    parts: list[str] = []
    calls: list[dict[str, Any]] = []
    thoughts: list[str] = []
    logprobs: list[m.TokenLogprob] = []
    async for ev in events:
        if isinstance(ev, (m.Prefill, m.Held)):
            continue  # progress only (see _events)
        if isinstance(ev, m.Text):
            parts.append(ev.text)
            thoughts.append(ev.reasoning)
            logprobs += ev.logprobs
        elif isinstance(ev, m.ToolCall):
            calls.append(whole_call(ev))
        elif isinstance(ev, m.Done):
            reply = Reply(req.gen.kind, req.model, logprobs=req.gen.logprobs)
            return web.json_response(out.whole(reply.whole(
                "".join(parts), ev, calls, reasoning="".join(thoughts), logprobs=logprobs)))
        else:
            raise runner_error(ev.code, ev.message, _param(req, ev))
    raise AssertionError("unreachable: the event stream never ends")


async def _stream(request: web.Request, req: GenRequest, events: AsyncIterator[m.Event],
                  meter: Meter, out: Output) -> web.StreamResponse:
    # The runner checks a request against the model when it takes it: its refusal is the first
    # event, and becomes the answer's status (a 400 naming the field), before any header.
    first = await anext(events)
    while isinstance(first, m.Prefill) and first.total == 0:  # still being read (m.Prefill)
        first = await anext(events)
    if isinstance(first, m.Error):
        raise runner_error(first.code, first.message, _param(req, first))
    resp = web.StreamResponse(headers=sse.HEADERS)
    reply = Reply(req.gen.kind, req.model, include_usage=req.include_usage,
                  logprobs=req.gen.logprobs)
    try:
        await resp.prepare(request)
        await resp.write(out.begin())
        if req.gen.kind == "chat":
            await resp.write(out.chunk(reply.chunk(role=True)))
        calls = 0
        async for ev in _after(first, events):
            if isinstance(ev, (m.Prefill, m.Held)):
                continue  # progress only (see _events)
            if isinstance(ev, m.Text):
                await resp.write(out.chunk(reply.chunk(
                    ev.text if ev.text or not ev.reasoning else None, reasoning=ev.reasoning,
                    logprobs=ev.logprobs)))
                continue
            if isinstance(ev, m.ToolCall):
                for piece in streamed_call(ev, calls):
                    await resp.write(out.chunk(reply.chunk(tool_calls=piece)))
                calls += 1
                continue
            if isinstance(ev, m.Done):
                await resp.write(out.chunk(reply.chunk(finish_reason=ev.finish_reason)))
                if req.include_usage:
                    await resp.write(out.chunk(reply.usage_chunk(ev)))
            else:
                err = runner_error(ev.code, ev.message, _param(req, ev))
                meter.failed_code = err.status
                logger.bind(instance=req.model).warning("stream ended by an error: {}",
                                                        err.message)
                await resp.write(out.failed(err))
            break
        await resp.write(out.end())
        await resp.write_eof()
    except ConnectionError:
        meter.failed_code = 499  # the client left; the caller's `stream.close()` cancels
    return resp
