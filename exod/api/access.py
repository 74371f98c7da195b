"""Who a request is and what it may do: the key the auth middleware found for it
(`request["key"]`, an exod.core.keys.ApiKey), the scope each route needs, and the answers
to a key that asks for more (403 naming the scope) or for an instance it cannot see (404, as
for a model that does not exist: what hosted APIs answer for a model a key may not use).

A route that is not in ROUTE_SCOPES needs `admin`: a new endpoint is closed until it is
listed. A handler that needs more for some requests than its route's scope (another key's
usage, say) calls `require(request, "admin")`.
"""

from __future__ import annotations

from aiohttp import web

from exod.api.errors import NO_RETRY, ApiError, model_not_found
from exod.core.keys import ANONYMOUS, ApiKey, Scope

KEY = "key"  # request[KEY]: the ApiKey
KEY_ID = "key_id"  # request[KEY_ID]: the digest of the secret it sent (b"" without auth)

PUBLIC = ("/health", "/")  # no data behind them: the page's script asks for a key

ROUTE_SCOPES: dict[str, Scope] = {
    **dict.fromkeys((
        "/ready", "/status.json",
        "/v1/models", "/v1/models/{model}", "/v1/chat/completions", "/v1/completions",
        "/v1/messages", "/v1/messages/count_tokens", "/v1/responses", "/v1/embeddings",
        "/v1/rerank",
        "/api/chat", "/api/generate", "/api/embed", "/api/embeddings", "/api/version",
        "/api/tags", "/api/show", "/api/ps"), "infer"),
    "/api/pull": "manage",
    "/api/delete": "manage",
    "/metrics": "admin",  # every key's figures
}


def key_of(request: web.Request) -> ApiKey:
    key = request.get(KEY, ANONYMOUS)
    assert isinstance(key, ApiKey)
    return key


def forbidden(key: ApiKey, scope: str) -> ApiError:
    return ApiError(403, f"This key ({key.name}) lacks the `{scope}` scope, which this request "
                         "needs: the operator grants scopes in the key's `scopes`.",
                    "permission_error", "insufficient_scope", headers=dict(NO_RETRY))


def require(request: web.Request, scope: Scope) -> None:
    """Raise 403, naming `scope`, unless the request's key holds it."""
    key = key_of(request)
    if not key.may(scope):
        raise forbidden(key, scope)


def route_scope(request: web.Request) -> Scope | None:
    """The scope the request's route needs; None for a public path or no route (a 404 or 405
    is answered as it would be)."""
    if request.path in PUBLIC or request.match_info.http_exception is not None:
        return None
    resource = request.match_info.route.resource
    canonical = resource.canonical if resource is not None else request.path
    return ROUTE_SCOPES.get(canonical, "admin")


def check_instance(key: ApiKey, instance: str | None, asked: str) -> None:
    """A request for instance `instance` (what `asked` names; None: none) by `key`: 404 as
    if it did not exist, unless the key may use it."""
    if instance is not None and not key.sees(instance):
        raise model_not_found(asked)
