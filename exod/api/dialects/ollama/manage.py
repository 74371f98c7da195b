"""Ollama's endpoints that generate nothing: `GET /` (`HEAD /`), `/api/version`, `/api/tags`,
`POST /api/show`, `GET /api/ps`, `POST /api/pull`, `DELETE /api/delete` (`/api/embed` and
`/api/embeddings` are the embedding instances', exod.api.dialects.ollama.embed).

What they list are exod's instances, by name, as /v1/models does. A pull fetches a hub
repository through exod's own fetcher (exod.daemon.hub_commands: never timed out, resumed
after a stop), streaming Ollama's status lines; a delete removes a repository from the cache
unless an instance runs from it: whatever stands at its name, a link removed as a link (never
followed); what cannot be removed is a 409 that says what was and what was not.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from typing import TYPE_CHECKING, Any

from aiohttp import web

from exod.wire import control as cm
from exod.api import page
from exod.api.audit import AUDIT_MODEL
from exod.api.access import check_instance, key_of
from exod.api.errors import ApiError, bad_request, model_not_found
from exod.api.dialects.ollama.fields import OLLAMA_MANAGE
from exod.api.fields import Reading
from exod.api.ignored import header
from exod.api.dialects.ollama import objects
from exod.api.request import http
from exod.facts import vision
from exod.facts.caps import chat_template
from exod.facts.details import ModelFacts
from exod.core import request_rules as rules
from exod.core.states import State
from exod.daemon import hub_commands
from exod.daemon.downloads import Outcome
from exod.core import hub_ref
from exod.core.hub_ref import HubRef

if TYPE_CHECKING:
    from exod.api.dialects.ollama.host import ServerView
    from exod.daemon.instance import InstanceRuntime

NDJSON = "application/x-ndjson"
HUB_HOSTS = ("hf.co/", "huggingface.co/")
RUNNING = "Ollama is running"


def ndjson(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def repository(name: str) -> HubRef | None:
    """A hub repository as Ollama's clients name one: `hf.co/ORG/NAME[:REVISION]` (Ollama's
    own form), `ORG/NAME[:REVISION]`, or exod's `hf:ORG/NAME[@REVISION]`; `:latest` is the
    main branch. None for a name of no repository (an instance's, or Ollama's library's);
    ValueError for a malformed one."""
    if hub_ref.is_hub_name(name):
        return hub_ref.parse(name)
    body = next((name[len(h):] for h in HUB_HOSTS if name.startswith(h)), name)
    if body.count("/") != 1:
        return None
    repo, _, revision = body.partition(":")
    return hub_ref.make(repo, hub_ref.DEFAULT_REVISION if revision in ("", "latest")
                        else revision)


@http
def model_field(raw: Any, kind: str) -> tuple[str, dict[str, Any], tuple[str, ...]]:
    """(the model named, the body, the fields ignored) of a management endpoint's body."""
    r = Reading(OLLAMA_MANAGE)
    b = rules.body(raw)
    r.keys(b, kind)
    name = b.get("model") if b.get("model") is not None else b.get("name")
    return rules.model(name), b, r.ignored


class OllamaManage:
    def __init__(self, api: ServerView) -> None:
        self.api = api
        self.sup = api.sup

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_get("/", self.root)  # HEAD too: aiohttp answers it from the GET handler
        router.add_get("/api/version", self.version)
        router.add_get("/api/tags", self.tags)
        router.add_post("/api/show", self.show)
        router.add_get("/api/ps", self.ps)
        router.add_post("/api/pull", self.pull)
        router.add_delete("/api/delete", self.delete)

    # ---- read-only ------------------------------------------------------------------------
    async def root(self, request: web.Request) -> web.Response:
        """A browser gets the status page; Ollama's clients (which probe `/`) its words."""
        if "text/html" in request.headers.get("Accept", ""):
            return await page.index(request)
        return web.Response(text=RUNNING)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": objects.API_VERSION})

    async def _facts(self, inst: InstanceRuntime) -> ModelFacts:
        model_dir = await asyncio.to_thread(self.sup.hub.model_dir, inst)
        if model_dir is None:
            return ModelFacts()  # a hub model not fetched yet
        return await inst.lane.facts(model_dir)

    async def tags(self, request: web.Request) -> web.Response:
        """The instances, as /v1/models lists them."""
        key = key_of(request)
        models = [objects.tag(i.name, await self._facts(i)) for i in self.sup.ordered()
                  if key.sees(i.name)]
        # Another node's: its files are there, not here (its node's /api/show tells).
        models += [objects.tag(n, ModelFacts()) for n in self.api.cluster_instances(key)]
        return web.json_response({"models": models})

    async def show(self, request: web.Request) -> web.StreamResponse:
        name, _, ignored = await self.api.body(request, lambda b: model_field(b, "show"))
        if self.sup.serving(name) is None and (
                sent := await self.api.elsewhere(request, name)) is not None:
            return sent  # another node's instance: its node shows it
        inst = self._instance(request, name)
        facts = await self._facts(inst)
        caps = await inst.lane.capabilities()
        model_dir = await asyncio.to_thread(self.sup.hub.model_dir, inst)
        template = await asyncio.to_thread(chat_template, model_dir) if model_dir else None
        sees = model_dir is not None and await asyncio.to_thread(vision.sees, model_dir) is not None
        limits = await self.api.limits(inst)
        source = str(inst.config.hub) if inst.config.hub is not None else str(inst.config.model)
        obj = objects.show(facts, caps, template, source, limits.context, sees)
        serves = await inst.lane.serves()
        if serves in ("embed", "rerank"):  # an encoder generates nothing; Ollama has no rerank
            obj["capabilities"] = ["embedding"] if serves == "embed" else []
        return web.json_response(obj, headers=header(ignored))

    async def ps(self, request: web.Request) -> web.Response:
        """What runs (ready), with the memory it was admitted with and when it stops idle."""
        now, wall, key = self.sup.now(), time.time(), key_of(request)
        models = []
        for inst in self.sup.ordered():
            if inst.state is not State.READY or not key.sees(inst.name):
                continue
            facts = await self._facts(inst)
            due = inst.idle.stops_at()
            left = objects.FOREVER if math.isinf(due) else max(0.0, due - now)
            limits = await self.api.limits(inst)
            models.append(objects.running(inst.name, facts, inst.memory_need or facts.size,
                                          wall + left, limits.context,
                                          unified=sys.platform == "darwin"))
        return web.json_response({"models": models})

    def _instance(self, request: web.Request, name: str) -> InstanceRuntime:
        inst = self.sup.serving(name)
        if inst is None:
            raise model_not_found(name)
        check_instance(key_of(request), inst.name, name)
        return inst

    # ---- the cache ------------------------------------------------------------------------
    def _repository(self, request: web.Request, name: str, verb: str) -> HubRef:
        """The hub repository a pull or delete names: a repository, or an instance's (its
        model's); refused by name for anything else. A key limited to some instances may
        name only their repositories: any other is unknown to it."""
        try:
            ref = repository(name)
        except ValueError as e:
            raise bad_request(f"`model`: {e}", "model") from None
        key = key_of(request)
        if ref is not None:
            if key.instances is not None and not any(
                    i.config.hub is not None and i.config.hub.repo == ref.repo
                    for i in self.sup.ordered() if key.sees(i.name)):
                raise model_not_found(name)
            return ref
        inst = self.sup.serving(name)
        check_instance(key, None if inst is None else inst.name, name)
        if inst is None:
            raise ApiError(404, f"model '{name}' not found: exod {verb}s models of the Hugging "
                                "Face hub, named ORG/NAME (or hf.co/ORG/NAME[:REVISION]), or "
                                "an instance", "invalid_request_error", "model_not_found",
                           "model")
        if inst.config.hub is None:
            raise bad_request(f"`model`: instance {inst.name!r} is served from the directory "
                              f"{inst.config.model}, not from exod's cache: there is nothing "
                              f"to {verb}", "model")
        return inst.config.hub

    async def pull(self, request: web.Request) -> web.StreamResponse:
        name, body, ignored = await self.api.body(request, lambda b: model_field(b, "pull"))
        request[AUDIT_MODEL] = name
        stream = http(rules.flag)(body.get("stream"), "stream", True)
        ref = self._repository(request, name, "pull")
        steps = hub_commands.follow(self.sup, ref)
        if not stream:
            async for step in steps:
                if isinstance(step, Outcome):
                    if step.path is None:
                        raise pull_failed(ref, step.error)
                    return web.json_response({"status": "success"}, headers=header(ignored))
            raise AssertionError("unreachable: follow ends with the outcome")
        resp = web.StreamResponse(headers={"Content-Type": NDJSON, **header(ignored)})
        await resp.prepare(request)
        last: tuple[str, int] | None = None
        async for step in steps:
            if isinstance(step, Outcome):
                if step.path is None:
                    await resp.write(ndjson({"error": objects.error_text(
                        pull_failed(ref, step.error))}))
                else:
                    for status in ("writing manifest", "success"):
                        await resp.write(ndjson({"status": status}))
                break
            line = status_line(ref, step)
            key = (str(line.get("status")), int(line.get("completed", -1)))
            if key != last:  # a new figure, not a rate that moved alone
                await resp.write(ndjson(line))
                last = key
        await resp.write_eof()
        return resp

    async def delete(self, request: web.Request) -> web.Response:
        name, _, ignored = await self.api.body(request, lambda b: model_field(b, "delete"))
        request[AUDIT_MODEL] = name
        ref = self._repository(request, name, "delete")
        try:
            removed = await hub_commands.remove_repo(self.sup, ref)
        except hub_commands.InUse as e:
            raise ApiError(409, f"cannot delete {ref.repo}: {e}", "invalid_request_error",
                           "model_in_use", "model") from None
        if not removed.found:
            raise ApiError(404, f"model '{name}' not found: {ref.repo} is not in exod's cache "
                                f"({self.sup.hub.folder})", "invalid_request_error",
                           "model_not_found", "model")
        if not removed.whole:  # the cache holds what exod may not remove (another's files)
            raise ApiError(409, f"cannot delete all of {ref.repo}: {removed.text()}",
                           "invalid_request_error", "cache_not_removable", "model")
        return web.Response(headers=header(ignored))


def status_line(ref: HubRef, ev: cm.DownloadEvent) -> dict[str, Any]:
    """A progress event as Ollama's pull streams it."""
    if ev.phase == "downloading":
        return {"status": f"pulling {ref.repo}", "digest": f"hf:{ref.repo}",
                "total": ev.total_bytes, "completed": ev.done_bytes}
    if ev.phase == "verifying":
        return {"status": "verifying sha256 digest"}
    if ev.phase == "waiting":
        return {"status": ev.detail}
    return {"status": "pulling manifest"}


def pull_failed(ref: HubRef, error: str) -> ApiError:
    """A refused fetch: 404 when the hub (or an offline cache) has no such model, else 502
    (the hub failed exod)."""
    missing = "not found" in error or "not in the cache" in error
    return ApiError(404 if missing else 502, f"pull {ref}: {error}",
                    "invalid_request_error" if missing else "server_error",
                    "model_not_found" if missing else "hub_error", "model")
