"""What every request meets before its route: errors in its dialect's shape, the Host
allow-list, CORS and JSON-only bodies (exod.api.browser), and the key (exod.api.access). A mixin of
`exod.api.app.ApiServer`, kept apart so each module stays one job."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from exod.api.browser import PREFLIGHT_HEADERS, CorsPolicy, HostPolicy, is_json
from exod.api.dialects.anthropic import request as anthropic
from exod.api.access import KEY, KEY_ID, PUBLIC, forbidden, route_scope
from exod.api.errors import ApiError, unauthorized
from exod.api.guard import ConnectionGuard
from exod.api.dialects.ollama.objects import error_text
from exod.core.keys import ANONYMOUS, Keyring

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Middlewares:
    keyring: Keyring
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
        """The request's key (`request["key"]`, exod.api.access), and the scope its route
        needs. A 401 names no secret: neither what was sent nor any that is accepted."""
        ring = self.keyring
        if not ring.auth:
            request[KEY], request[KEY_ID] = ANONYMOUS, b""
            return await handler(request)
        where = misplaced(request)
        if where is not None:
            raise unauthorized(f"A key was sent in {where}, where it may be logged: send it "
                               "only as `Authorization: Bearer KEY` (or `x-api-key: KEY`), and "
                               "make a new key if this one has been seen.")
        scope = route_scope(request)
        if scope is None:  # a public path, or one that no route serves (404, 405)
            request[KEY], request[KEY_ID] = ANONYMOUS, b""
            if request.path in PUBLIC:
                return await handler(request)
        offered = offered_secret(request)
        found = None if offered is None else ring.match(offered)
        if found is None:
            raise unauthorized("Missing key: send `Authorization: Bearer KEY` (or `x-api-key: "
                               "KEY`)." if offered is None else "Incorrect API key.")
        request[KEY_ID], request[KEY] = found
        if scope is not None and not found[1].may(scope):
            raise forbidden(found[1], scope)
        return await handler(request)


# Where some clients put a key that exod refuses to read there: a query string ends up in
# access logs and browser histories, and a header of another scheme in proxies' logs.
QUERY_NAMES = frozenset({"key", "api_key", "apikey", "api-key", "token", "access_token",
                         "auth", "authorization", "x-api-key", "bearer"})
OTHER_HEADERS = ("api-key", "x-goog-api-key", "x-auth-token", "x-access-token", "x-token")


def misplaced(request: web.Request) -> str | None:
    """Where the request puts a key other than where exod reads it, or None (never the key)."""
    for name in request.query:
        if name.lower() in QUERY_NAMES:
            return f"the query string (`{name.lower()}`)"
    for header in OTHER_HEADERS:
        if header in request.headers:
            return f"the `{header}` header"
    scheme = request.headers.get("Authorization", "").partition(" ")[0]
    if scheme and scheme.lower() != "bearer":
        return f"an `Authorization: {scheme[:16]}` header (only `Bearer` is read)"
    return None


def offered_secret(request: web.Request) -> bytes | None:
    """The secret of `Authorization: Bearer ...`, else of `x-api-key` (Anthropic's clients
    send that), as bytes (aiohttp decoded the header with surrogates for bytes that are not
    UTF-8); None when neither is sent."""
    given = request.headers.get("Authorization")
    if given is not None:
        value = given.partition(" ")[2]
    elif "X-Api-Key" in request.headers:
        value = request.headers["X-Api-Key"]
    else:
        return None
    return value.strip().encode("utf-8", "surrogateescape")


def error_response(e: ApiError, path: str = "") -> web.Response:
    """In the shape of the dialect the path speaks: Anthropic's under /v1/messages, Ollama's
    (`{"error": TEXT}`, which its clients raise with the status) under /api/."""
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return web.json_response(anthropic.error_body(e), status=anthropic.error_status(e),
                                 headers=e.headers)
    if path.startswith("/api/"):
        return web.json_response({"error": error_text(e)}, status=e.status, headers=e.headers)
    return web.json_response(e.body(), status=e.status, headers=e.headers)
