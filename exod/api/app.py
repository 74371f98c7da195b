"""The HTTP server (aiohttp, inside the daemon's event loop) and its routes.

    GET  /                     the status page (static HTML: no data, no token needed)
    GET  /status.json          what the status page shows (exod.api.page)
    GET  /health               the daemon is alive (never needs the token)
    GET  /ready                200 when every autostart instance is ready, else 503 naming them
    GET  /metrics              Prometheus text format (exod.api.metrics)
    GET  /v1/models            every instance, with its state
    GET  /v1/models/{model}
    POST /v1/chat/completions  chat template applied by the runner; stream or not
    POST /v1/completions       raw prompt

A request goes to an instance only while it is `ready` (for a multi-rank instance: every rank
is; an on-demand instance is started by the request, which waits in the queue while it loads),
through the instance's admission gate, to its rank 0 over the runner's link (exod.api.serving).
Errors use
OpenAI's JSON shape. A client that disconnects cancels its handler (handler_cancellation), and
that cancels the generation in the runner.
"""

from __future__ import annotations

import errno
import hmac
import json
import os
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web
from loguru import logger

from exod.api import address, page
from exod.api.errors import ApiError, bad_request, error_body, model_not_found, unauthorized
from exod.api.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from exod.api.schema import parse_chat, parse_completion
from exod.api.serving import Serving
from exod.api.token import read_token
from exod.api.view import Daemon
from exod.config.schema import Api
from exod.core.states import State

if TYPE_CHECKING:
    from exod.daemon.instance import InstanceRuntime

PUBLIC = ("/health", "/")  # no data behind them: the page's script asks for the token
MAX_BODY = 16 * 2**20  # long chat histories are fine; a runaway upload is not
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ApiServer:
    def __init__(self, cfg: Api, daemon: Daemon) -> None:
        self.cfg = cfg
        self.sup = daemon
        self.host, self.port = address.parse_listen(cfg.listen)
        self.token: str | None = None
        self.started_wall = int(time.time())
        self._runner: web.AppRunner | None = None
        self.serving = Serving(daemon, daemon.loop)
        self.gates = self.serving.gates
        self.metrics = self.serving.metrics

    # ---- lifecycle --------------------------------------------------------------------
    async def start(self) -> None:
        """Bind and serve; raises OSError with a one-line message (e.g. port in use)."""
        if self.cfg.token_file is not None:
            self.token = read_token(self.cfg.token_file)
        app = web.Application(middlewares=[self._errors, self._auth], client_max_size=MAX_BODY)
        app.router.add_get("/health", self.health)
        app.router.add_get("/ready", self.ready)
        app.router.add_get("/metrics", self.scrape)
        app.router.add_get("/", page.index)
        app.router.add_get("/status.json", self.status_json)
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

    def instance_changed(self, inst: InstanceRuntime) -> None:
        self.serving.instance_changed(inst)

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
        if self.token is not None and request.path not in PUBLIC:
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
        waiting = [i for i in self.sup.ordered() if i.config.always_on
                   and i.state is not State.READY]
        if not waiting:
            return web.json_response({"status": "ready"})
        names = ", ".join(f"{i.name} ({i.state.value})" for i in waiting)
        body = error_body(f"not ready: {names}", "service_unavailable_error", "not_ready")
        body["not_ready"] = [{"name": i.name, "state": i.state.value} for i in waiting]
        return web.json_response(body, status=503)

    async def status_json(self, request: web.Request) -> web.Response:
        return web.json_response(page.status_json(self.sup, self.serving))

    async def scrape(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(),
                            headers={"Content-Type": METRICS_CONTENT_TYPE})

    def _model_json(self, inst: InstanceRuntime) -> dict[str, Any]:
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
        return await self.serving.generate(request, parse_chat(await _body(request)))

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self.serving.generate(request, parse_completion(await _body(request)))


async def _body(request: web.Request) -> Any:
    raw = await request.read()
    try:
        return json.loads(raw)
    except ValueError as e:
        raise bad_request(f"the request body is not valid JSON: {e}") from None


def error_response(e: ApiError) -> web.Response:
    return web.json_response(e.body(), status=e.status, headers=e.headers)
