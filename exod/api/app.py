"""The HTTP server (aiohttp, inside the daemon's event loop) and its routes.

    GET  /health               the daemon is alive (never needs the token)
    GET  /ready                200 when every autostart instance is ready, else 503 naming them
    GET  /v1/models            every instance, with its state
    GET  /v1/models/{model}
    POST /v1/chat/completions  chat template applied by the runner; stream or not
    POST /v1/completions       raw prompt

A request goes to an instance only while it is `ready` (for a multi-rank instance: every rank
is), through the instance's admission gate, to its rank 0 over the runner's link. Errors use
OpenAI's JSON shape. A client that disconnects cancels its handler (handler_cancellation), and
that cancels the generation in the runner.
"""

from __future__ import annotations

import errno
import hmac
import json
import os
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from aiohttp import web
from loguru import logger

from exod import messages as m
from exod.api import address
from exod.api.admission import Gate, QueueFull
from exod.api.errors import (
    ApiError,
    bad_request,
    error_body,
    model_not_found,
    not_ready,
    queue_full,
    runner_error,
    served_elsewhere,
    unauthorized,
)
from exod.api.objects import DONE, SSE_HEADERS, Reply, sse
from exod.api.schema import GenRequest, parse_chat, parse_completion
from exod.api.token import read_token
from exod.config.schema import Api, Instance
from exod.core.states import State
from exod.daemon.link import Link, RequestStream

MAX_BODY = 16 * 2**20  # long chat histories are fine; a runaway upload is not
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ServedInstance(Protocol):
    """What the API needs of an instance."""

    @property
    def name(self) -> str: ...

    @property
    def state(self) -> State: ...

    @property
    def config(self) -> Instance: ...

    @property
    def served_by(self) -> str | None:
        """The host whose exod serves it, when that is not this one (its rank 0 runs there)."""
        ...

    def serving_link(self) -> Link | None: ...


class Daemon(Protocol):
    """What the API needs of the daemon."""

    @property
    def phase(self) -> str: ...

    def instance(self, name: str) -> ServedInstance | None: ...

    def ordered(self) -> Sequence[ServedInstance]: ...


class ApiServer:
    def __init__(self, cfg: Api, daemon: Daemon) -> None:
        self.cfg = cfg
        self.sup = daemon
        self.host, self.port = address.parse_listen(cfg.listen)
        self.token: str | None = None
        self.started_wall = int(time.time())
        self.gates: weakref.WeakKeyDictionary[ServedInstance, Gate] = \
            weakref.WeakKeyDictionary()
        self._runner: web.AppRunner | None = None

    # ---- lifecycle --------------------------------------------------------------------
    async def start(self) -> None:
        """Bind and serve; raises OSError with a one-line message (e.g. port in use)."""
        if self.cfg.token_file is not None:
            self.token = read_token(self.cfg.token_file)
        app = web.Application(middlewares=[self._errors, self._auth], client_max_size=MAX_BODY)
        app.router.add_get("/health", self.health)
        app.router.add_get("/ready", self.ready)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/models/{model}", self.model)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        try:
            await site.start()
        except OSError as e:
            await self._runner.cleanup()
            self._runner = None
            code = e.errno or errno.EADDRINUSE
            raise OSError(code, f"HTTP API {self.cfg.listen}: {os.strerror(code)}") from None
        if self._runner.addresses:  # the real port when listen asked for :0
            self.port = self._runner.addresses[0][1]
        logger.info("HTTP API on {}{}", self.url,
                    " (bearer token required)" if self.token else "")

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def url(self) -> str:
        return address.url(self.host, self.port)

    def info(self) -> dict[str, Any]:
        """For the status snapshot: where exoctl (and people) find the API."""
        return {"listen": self.cfg.listen, "url": self.url, "auth": self.token is not None,
                "token_file": str(self.cfg.token_file) if self.cfg.token_file else None}

    def instance_changed(self, inst: ServedInstance) -> None:
        """Supervisor listener: requests queued for an instance that left `ready` get a 503."""
        gate = self.gates.get(inst)
        if gate is not None and inst.state is not State.READY:
            gate.reject_waiting(lambda: not_ready(inst.name, inst.state.value,
                                                  inst.state is State.STOPPING))

    # ---- middlewares ------------------------------------------------------------------
    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as e:
            return error_response(e)
        except web.HTTPException as e:  # aiohttp's own: unknown route, wrong method, too big
            if e.status < 400:
                raise
            kind = "invalid_request_error" if e.status < 500 else "server_error"
            message = f"{e.reason}: {request.method} {request.path}"
            return web.json_response(error_body(message, kind), status=e.status,
                                     headers={k: v for k, v in e.headers.items()
                                              if k.lower() == "allow"})

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self.token is not None and request.path != "/health":
            given = request.headers.get("Authorization", "")
            scheme, _, value = given.partition(" ")
            if not given:
                raise unauthorized("Missing bearer token: send `Authorization: Bearer TOKEN`.")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                    value.strip().encode(), self.token.encode()):
                raise unauthorized("Incorrect bearer token.")
        return await handler(request)

    # ---- plain endpoints ----------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "daemon": self.sup.phase})

    async def ready(self, request: web.Request) -> web.Response:
        waiting = [i for i in self.sup.ordered() if i.config.autostart
                   and i.state is not State.READY]
        if not waiting:
            return web.json_response({"status": "ready"})
        names = ", ".join(f"{i.name} ({i.state.value})" for i in waiting)
        body = error_body(f"not ready: {names}", "service_unavailable_error", "not_ready")
        body["not_ready"] = [{"name": i.name, "state": i.state.value} for i in waiting]
        return web.json_response(body, status=503)

    def _model_json(self, inst: ServedInstance) -> dict[str, Any]:
        gate = self.gates.get(inst)
        return {"id": inst.name, "object": "model", "created": self.started_wall,
                "owned_by": "exod", "state": inst.state.value,
                "active": gate.active if gate else 0, "queued": gate.waiting if gate else 0}

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list",
                                  "data": [self._model_json(i) for i in self.sup.ordered()]})

    async def model(self, request: web.Request) -> web.Response:
        name = request.match_info["model"]
        inst = self.sup.instance(name)
        if inst is None:
            raise model_not_found(name)
        return web.json_response(self._model_json(inst))

    # ---- generation -------------------------------------------------------------------
    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, parse_chat(await _body(request)))

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, parse_completion(await _body(request)))

    def _ready_instance(self, name: str) -> ServedInstance:
        inst = self.sup.instance(name)
        if inst is None:
            raise model_not_found(name)
        if inst.served_by is not None:
            raise served_elsewhere(name, inst.served_by)
        if inst.state is not State.READY:
            raise not_ready(name, inst.state.value, inst.state is State.STOPPING)
        return inst

    def _gate(self, inst: ServedInstance) -> Gate:
        gate = self.gates.get(inst)
        if gate is None:
            gate = self.gates[inst] = Gate(inst.config.max_concurrency, inst.config.max_queue)
        return gate

    async def _generate(self, request: web.Request, req: GenRequest) -> web.StreamResponse:
        inst = self._ready_instance(req.model)
        gate = self._gate(inst)
        try:
            await gate.enter()
        except QueueFull:
            raise queue_full(inst.name, gate.limit, gate.queue) from None
        try:
            # Waiting may have taken a while: ready still, and the very same instance?
            if self._ready_instance(req.model) is not inst:
                raise not_ready(inst.name, "replaced by a reload")
            link = inst.serving_link()
            if link is None:
                raise not_ready(inst.name, "its runner is gone")
            stream = link.open(req.to_runner())
            try:
                if req.stream:
                    return await self._stream(request, req, stream)
                return await self._whole(req, stream)
            finally:
                stream.close()  # cancels the generation unless it finished
        finally:
            gate.leave()

    async def _whole(self, req: GenRequest, stream: RequestStream) -> web.Response:
        parts: list[str] = []
        while True:
            ev = await stream.next()
            if isinstance(ev, m.Text):
                parts.append(ev.text)
            elif isinstance(ev, m.Done):
                reply = Reply(req.kind, req.model)
                return web.json_response(reply.whole(
                    "".join(parts), ev.finish_reason, ev.prompt_tokens, ev.completion_tokens))
            else:
                raise runner_error(ev.code, ev.message)

    async def _stream(self, request: web.Request, req: GenRequest,
                      stream: RequestStream) -> web.StreamResponse:
        resp = web.StreamResponse(headers=SSE_HEADERS)
        reply = Reply(req.kind, req.model, include_usage=req.include_usage)
        try:
            await resp.prepare(request)
            if req.kind == "chat":
                await resp.write(sse(reply.chunk(role=True)))
            while True:
                ev = await stream.next()
                if isinstance(ev, m.Text):
                    await resp.write(sse(reply.chunk(ev.text)))
                    continue
                if isinstance(ev, m.Done):
                    await resp.write(sse(reply.chunk(finish_reason=ev.finish_reason)))
                    if req.include_usage:
                        await resp.write(sse(reply.usage_chunk(ev.prompt_tokens,
                                                               ev.completion_tokens)))
                else:
                    err = runner_error(ev.code, ev.message)
                    logger.bind(instance=req.model).warning("stream ended by an error: {}",
                                                            err.message)
                    await resp.write(sse(err.body()))
                break
            await resp.write(DONE)
            await resp.write_eof()
        except ConnectionError:
            pass  # the client left; `stream.close()` in the caller cancels the generation
        return resp


async def _body(request: web.Request) -> Any:
    raw = await request.read()
    try:
        return json.loads(raw)
    except ValueError as e:
        raise bad_request(f"the request body is not valid JSON: {e}") from None


def error_response(e: ApiError) -> web.Response:
    return web.json_response(e.body(), status=e.status, headers=e.headers)
