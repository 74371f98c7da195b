"""The status page: `/` serves one static HTML file (no data in it, so it needs no token), and
its script polls `/status.json` (behind the token, like every endpoint with data) while the
page is open. Nothing runs in the daemon for the page when nobody looks at it."""

from __future__ import annotations

import time
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

from aiohttp import web

from exod.core.keys import ANONYMOUS, ApiKey
from exod.core.usage.recent import SPAN
from exod.wire.protocol import to_wire

if TYPE_CHECKING:
    from exod.api.serving import Serving
    from exod.api.view import DaemonView

LOG_LINES = 8  # per instance, on the page
TOP_KEYS = 10  # the busiest keys, on the page


@cache
def _html() -> bytes:
    return resources.files("exod.api").joinpath("static/status.html").read_bytes()


async def index(request: web.Request) -> web.Response:
    return web.Response(body=_html(), content_type="text/html", charset="utf-8",
                        headers={"Cache-Control": "no-cache"})


def status_json(sup: DaemonView, serving: Serving, key: ApiKey = ANONYMOUS) -> dict[str, Any]:
    """The page's data as `key` may see it: the instances it may use (their status, figures and
    logs) and, unless it is an `admin` key, only its own line among the busiest keys."""
    snap = to_wire(sup.snapshot())
    seen = [i for i in sup.ordered() if key.sees(i.name)]
    snap["instances"] = [i for i in snap["instances"] if key.sees(i["name"])]
    figures: dict[str, Any] = {}
    for inst in seen:
        active, queued = inst.lane.load()
        stats = serving.metrics.stats.get(inst.name)
        figures[inst.name] = {
            "active": active,
            "queued": queued,
            "generated_tokens": stats.generated_tokens if stats else 0,
            "prompt_tokens": stats.prompt_tokens if stats else 0,
        }
    keys = [{"key": k.key, "in_flight": k.in_flight, "recent_tokens": k.recent_tokens}
            for k in sup.usage.gate.load(time.monotonic())
            if key.may("admin") or k.key == key.name][:TOP_KEYS]
    return {**snap, "serving": figures, "keys": keys, "keys_span_s": SPAN,
            "logs": {i.name: [line.to_json() for line in sup.logs.tail(i.name, LOG_LINES)]
                     for i in seen}}
