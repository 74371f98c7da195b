"""`POST /api/chat` and `POST /api/generate`: Ollama's dialect (exod.api.dialects.ollama.request,
ollama_output) through the one generation path, with its `keep_alive`. What needs the model
before the request can be built is done here, before the daemon starts anything: a `suffix`
placed in the model's fill-in-the-middle tokens, and `think` refused for a model that does not
think (as Ollama refuses it). A body with nothing to generate loads the model (an on-demand
instance starts, and the answer waits until it is ready) or, with `keep_alive: 0`, stops it
once idle.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from aiohttp import web

from exod.api.dialects.ollama import request as ollama_request
from exod.api.dialects.ollama.output import OllamaOutput
from exod.api.dialects.ollama.request import Endpoint, OllamaView
from exod.api.access import check_instance, key_of
from exod.api.errors import bad_request, model_not_found
from exod.api.ignored import header
from exod.api.dialects.ollama.objects import timestamp
from exod.api.request import GenRequest
from exod.api.serving import refusal
from exod.core.keys import ApiKey
from exod.core.states import State
from exod.daemon.refusals import NotAdmitted

if TYPE_CHECKING:
    from exod.daemon.instance import InstanceRuntime
    from exod.api.dialects.ollama.host import ServerView

DIALECTS = {"chat": "ollama_chat", "generate": "ollama_generate"}


class OllamaGenerate:
    def __init__(self, api: ServerView) -> None:
        self.api = api
        self.sup = api.sup

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_post("/api/chat", self.chat)
        router.add_post("/api/generate", self.generate)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "chat")

    async def generate(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "generate")

    async def _serve(self, request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        req, view = await self.api.body(request, lambda b: ollama_request.parse(
            b, endpoint, self.api.cfg.strict_fields))
        if req is None:
            self.api.metrics.ignored.record(DIALECTS[endpoint], view.ignored)
            if (sent := await self.api.elsewhere(request, view.model)) is not None:
                return sent  # loaded (or unloaded) there: its rank 0's node decides
            return await self._load(view, key_of(request))
        arrived = time.monotonic_ns()  # the answer's durations count from here

        async def adapt(inst: InstanceRuntime, req: GenRequest) -> GenRequest:
            if view.suffix is None and not view.think:
                return req
            name, caps = inst.name, await inst.lane.capabilities()
            if view.suffix is not None:
                req = ollama_request.fill_in_middle(req, view.suffix, caps.fim, name)
            if view.think and caps.thinking is False:
                raise bad_request(f'"{name}" does not support thinking', "think")
            return req

        out = OllamaOutput(endpoint, view.model, req.gen.kind, arrived)
        return await self.api.generate(request, DIALECTS[endpoint], req, out, view.keep_alive,
                                       adapt)

    async def _load(self, view: OllamaView, key: ApiKey) -> web.Response:
        """Nothing to generate: load the model (waiting while an on-demand instance starts),
        or with keep_alive 0 stop it once no request is in flight (within its floor)."""
        traffic = self.sup.traffic
        named = self.sup.serving(view.model)
        check_instance(key, None if named is None else named.name, view.model)
        try:
            if view.keep_alive == 0:
                inst = self.sup.serving(view.model)
                if inst is None:
                    raise model_not_found(view.model)
                stays = not traffic.unload(inst) and inst.state is State.READY
                reason = "load" if stays else "unload"
            else:
                async with await traffic.admit(view.model, None, view.keep_alive):
                    reason = "load"
        except NotAdmitted as e:
            raise refusal(e) from None
        obj: dict[str, object] = {"model": view.model, "created_at": timestamp(time.time())}
        if view.endpoint == "chat":
            obj["message"] = {"role": "assistant", "content": ""}
        else:
            obj["response"] = ""
        return web.json_response({**obj, "done": True, "done_reason": reason},
                                 headers=header(view.ignored))
