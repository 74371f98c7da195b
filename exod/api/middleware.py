"""What every request meets before its route: errors in its dialect's shape, the Host
allow-list, CORS and JSON-only bodies (exod.api.browser), and the bearer token. A mixin of
`exod.api.app.ApiServer`, kept apart so each module stays one job."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

from aiohttp import web

from exod.api.browser import PREFLIGHT_HEADERS, CorsPolicy, HostPolicy, is_json
from exod.api.dialects.anthropic import request as anthropic
from exod.api.errors import ApiError, unauthorized
from exod.api.guard import ConnectionGuard
from exod.api.dialects.ollama.objects import error_text

PUBLIC = ("/health", "/")  # no data behind them: the page's script asks for the token
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Middlewares:
    tokens: list[bytes]
    hosts: HostPolicy
    cors: CorsPolicy
    guard: ConnectionGuard

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        transport = request.transport
        self.guard.busy.add(transport)  # a connection with a request in progress is not idle
        self.guard.seen.add(transport)
        try:
            return await handler(request)
        except ApiError as e:
            return error_response(e, request.path)
        except web.HTTPException as e:  # aiohttp's own: unknown route, wrong method, too big
            if e.status < 400:
                raise
            kind = "invalid_request_error" if e.status < 500 else "server_error"
            message = f"{e.reason}: {request.method} {request.path}"
            allow = {k: v for k, v in e.headers.items() if k.lower() == "allow"}
            return error_response(ApiError(e.status, message, kind, headers=allow),
                                  request.path)
        finally:
            self.guard.busy.discard(transport)

    @web.middleware
    async def _browser(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Host allow-list, CORS, JSON-only bodies (see exod.api.browser)."""
        if not self.hosts.allows(request.headers.get("Host")):
            raise ApiError(421, "Misdirected request: this Host is not served here (add it to "
                                "api.allowed_hosts if it is a name of this machine).",
                           "invalid_request_error", "host_not_allowed")
        origin = request.headers.get("Origin")
        cors = self.cors.headers(origin) if origin and self.cors.allows(origin) else {}
        if request.method == "OPTIONS" and self.cors.enabled:
            if not cors:
                raise ApiError(403, "This origin may not use the API (api.cors_origins).",
                               "invalid_request_error", "origin_not_allowed")
            return web.Response(status=204, headers={**cors, **PREFLIGHT_HEADERS})
        if request.method == "POST" and not is_json(request.headers.get("Content-Type", "")):
            raise ApiError(415, "The request body must be JSON: send `Content-Type: "
                                "application/json`.", "invalid_request_error",
                           "unsupported_media_type")
        if cors:
            try:
                resp = await handler(request)
            except ApiError as e:
                e.headers.update(cors)
                raise
            if not resp.prepared:
                resp.headers.update(cors)
            return resp
        return await handler(request)

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self.tokens and request.path not in PUBLIC:
            given = request.headers.get("Authorization", "")
            scheme, _, value = given.partition(" ")
            if not given and "X-Api-Key" in request.headers:  # Anthropic's clients send this
                scheme, value = "bearer", request.headers["X-Api-Key"]
            elif not given:
                raise unauthorized("Missing bearer token: send `Authorization: Bearer TOKEN` "
                                   "(or `x-api-key: TOKEN`).")
            # Header text is what aiohttp decoded (surrogates for bytes that are not UTF-8).
            offered = value.strip().encode("utf-8", "surrogateescape")
            # Every token is compared (no early exit): the time taken tells nothing.
            matches = [hmac.compare_digest(offered, t) for t in self.tokens]
            if scheme.lower() != "bearer" or not any(matches):
                raise unauthorized("Incorrect bearer token.")
        return await handler(request)


def error_response(e: ApiError, path: str = "") -> web.Response:
    """In the shape of the dialect the path speaks: Anthropic's under /v1/messages, Ollama's
    (`{"error": TEXT}`, which its clients raise with the status) under /api/."""
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return web.json_response(anthropic.error_body(e), status=anthropic.error_status(e),
                                 headers=e.headers)
    if path.startswith("/api/"):
        return web.json_response({"error": error_text(e)}, status=e.status, headers=e.headers)
    return web.json_response(e.body(), status=e.status, headers=e.headers)
