"""The audit log's HTTP side: every request to a route that needs `manage` or `admin`
(exod.api.access.ROUTE_SCOPES: pulling and deleting models, and whatever is added there
later), made with a key, gets a line: the key's name, the method and path, the model it names,
the answer's status (403 for a key without the scope) and when (exod.daemon.usage.keeper,
fsynced). `/metrics` is a read that scrapers repeat every few seconds: not audited. A request
with no valid key (401) names nobody and is not audited either."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from exod.api.access import KEY, route_scope
from exod.api.errors import ApiError
from exod.core.keys import ApiKey
from exod.daemon.usage.keeper import UsageKeeper

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
NOT_AUDITED = frozenset({"/metrics"})
AUDIT_MODEL = "audit_model"  # request[AUDIT_MODEL]: the model a handler found it names


def auditor(usage: UsageKeeper) -> Any:
    """The middleware (placed outside the auth middleware, which sets the key)."""

    @web.middleware
    async def audit(request: web.Request, handler: Handler) -> web.StreamResponse:
        status = 500
        try:
            resp = await handler(request)
            status = resp.status
            return resp
        except ApiError as e:
            status = e.status
            raise
        except web.HTTPException as e:
            status = e.status
            raise
        finally:
            key = request.get(KEY)
            if isinstance(key, ApiKey) and _audited(request):
                with contextlib.suppress(Exception):  # never in the way of the answer
                    await usage.audit(key.name, f"{request.method} {request.path}", status,
                                      model=str(request.get(AUDIT_MODEL, "")))

    return audit


def _audited(request: web.Request) -> bool:
    if request.path in NOT_AUDITED:
        return False
    return route_scope(request) in ("manage", "admin")
