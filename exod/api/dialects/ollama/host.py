"""What Ollama's routes need of the HTTP server (exod.api.app.ApiServer): a narrow view, so this
package never imports the server that adds its routes."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from aiohttp import web

    from exod.api.metrics import Metrics
    from exod.api.output import DialectOutput
    from exod.api.request import GenRequest, ModelLimits
    from exod.api.serving import Adapt
    from exod.api.view import DaemonView
    from exod.core.keys import ApiKey
    from exod.config.schema import Api
    from exod.daemon.instance import InstanceRuntime


T = TypeVar("T")


class ServerView(Protocol):
    @property
    def sup(self) -> DaemonView: ...

    @property
    def cfg(self) -> Api: ...

    @property
    def metrics(self) -> Metrics: ...

    async def body(self, request: web.Request, read: Callable[[Any], T]) -> T:
        """The request's JSON body as `read` reads it (a dialect's parser), read and parsed
        within the API's bounds."""
        ...

    async def limits(self, inst: InstanceRuntime) -> ModelLimits: ...

    async def generate(self, request: web.Request, dialect: str, req: GenRequest,
                       out: DialectOutput, keep_alive: float | None = None,
                       adapt: Adapt | None = None) -> web.StreamResponse:
        """Serve a checked request through the one generation path."""
        ...

    async def elsewhere(self, request: web.Request, model: str) -> web.StreamResponse | None:
        """The answer of the node that runs rank 0 of `model`'s instance, relayed, when that is
        not this node (exod.api.proxy); None when this node serves it."""
        ...

    def cluster_instances(self, key: ApiKey) -> dict[str, str]:
        """The instances other nodes announce that this node's config does not name, which
        `key` may use, each with the node that serves it."""
        ...
