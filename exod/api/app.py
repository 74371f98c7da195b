"""The HTTP server (aiohttp, inside the daemon's event loop) and its routes: OpenAI's API
(`/v1/...`: chat completions, completions, Anthropic Messages, OpenAI Responses, embeddings:
exod.api.dialects), Ollama's (`/api/*`: exod.api.dialects.ollama), `/health`, `/ready`,
`/metrics` (exod.api.metrics) and the status page (`/`, `/status.json`: exod.api.page).
Every endpoint: docs/api.md, "Endpoints".

A request goes to an instance only while it is `ready` (for a multi-rank instance: every rank
is; an on-demand instance is started by the request, which waits in the queue while it loads),
through the instance's admission gate, to its rank 0 over the runner's link (exod.api.serving).
Errors use OpenAI's JSON shape (Anthropic's and Ollama's under their paths). A client that
disconnects cancels its handler (handler_cancellation), and that cancels the generation in the
runner.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import time
from dataclasses import replace
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any, TypeVar

from aiohttp import web
from loguru import logger

from exod.api import page, stopping
from exod.api.browser import CorsPolicy, HostPolicy
from exod.api.access import check_instance, key_of
from exod.api.audit import auditor
from exod.api.dialects.anthropic import request as anthropic
from exod.api.dialects.anthropic.output import AnthropicOutput, CountOutput
from exod.api.dialects.embeddings.request import EmbedRequest, parse_embeddings, parse_rerank
from exod.api.dialects.ollama import embed as ollama_embed
from exod.api.dialects.ollama.generate import OllamaGenerate
from exod.api.dialects.ollama.manage import OllamaManage
from exod.api.dialects.openai.output import OpenAiOutput
from exod.api.dialects.openai.request import parse_chat, parse_completion
from exod.api.dialects.responses import request as responses
from exod.api.dialects.responses.output import ResponsesOutput
from exod.api.dialects.embeddings.output import openai_embeddings, rerank_answer
from exod.api.embedding import BIG_ANSWER, Embedded, Embedder, json_answer
from exod.api.errors import ApiError, bad_request, error_body
from exod.api.guard import ConnectionGuard, GuardedSite
from exod.api.httplog import quiet_logger
from exod.api.ignored import header
from exod.api.image_fetch import Fetcher, Policy
from exod.api.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from exod.api.middleware import Middlewares
from exod.api.models import ModelList
from exod.api.proxy.forward import Proxy
from exod.api.output import DialectOutput
from exod.api.request import GenRequest, ModelLimits
from exod.api.seal import Sealer
from exod.api.serving import Adapt, Serving
from exod.api.token import read_tokens
from exod.config.keys import auth_configured, keyring_entries, read_keys_file
from exod.core.keys import Keyring, digest
from exod.wire.control_status import ApiStatus
from exod.api.view import DaemonView
from exod.config.schema import Api
from exod.core import listen, upstream
from exod.core.states import State
from exod.paths import state_dir

if TYPE_CHECKING:
    from exod.daemon.instance import InstanceRuntime
from exod.daemon.ratelog import RateLimitedLog

# Bodies read and parsed at once, daemon-wide: many large bodies arriving together wait their
# turn instead of all sitting in memory (and on the loop) at the same time.
BODY_SLOTS = 4
# Parsed in a thread, and read by its dialect there too: a large JSON document would stall the
# loop, and its dialect's reading more (many small messages cost it several times the parse).
BIG_BODY = 256 * 1024
T = TypeVar("T")


class ApiServer(Middlewares, ModelList):
    def __init__(self, cfg: Api, daemon: DaemonView) -> None:
        self.cfg = cfg
        self.sup = daemon
        # Every address is served alike (e.g. exod's own port and Ollama's, 11434).
        self.addresses = [listen.parse_listen(a) for a in cfg.listen]
        self.keyring = Keyring()
        self.started_wall = int(time.time())
        self.hosts = HostPolicy([h for h, _ in self.addresses], cfg.allowed_hosts)
        self.cors = CorsPolicy(cfg.cors_origins)
        self.ratelog = RateLimitedLog()
        self.guard = ConnectionGuard(cfg.max_connections, self.ratelog)
        self._sites: list[GuardedSite] = []
        self._refusals: list[asyncio.Future[None]] = []  # 503s at a stop, under way
        self._bodies = asyncio.Semaphore(BODY_SLOTS)
        self.max_body = cfg.max_body_kib * 1024
        self._runner: web.AppRunner | None = None
        self.serving = Serving(daemon, Fetcher(Policy(cfg.image_urls, cfg.image_url_timeout,
                                                      cfg.image_url_allow)),
                               cfg.max_request_megapixels)
        self.embedder = Embedder(self.serving)
        self.metrics = self.serving.metrics
        # Reasoning handed to clients to send back (exod.api.seal); its key made on first use.
        # The seals of one request open to no more text than its body could have held.
        self.sealer = Sealer(state_dir() / "reasoning.key", most=self.max_body)
        # Requests for instances whose rank 0 runs on another node go on to it (any node
        # serves): idle connections to it kept for less than its header_timeout.
        self.proxy = Proxy(daemon.node_name, cfg.header_timeout / 2, self.ratelog)
        self.ollama = OllamaManage(self)
        self.ollama_generate = OllamaGenerate(self)

    @property
    def token(self) -> bool:
        """Whether requests must send a key."""
        return self.keyring.auth

    async def load_keys(self, api: Api, instances: Collection[str]) -> None:
        """(Re-)read the keys: api.keys and api.keys_file of `api` and api.token_file's
        tokens, checked against `instances`. Raises OSError (one line) and keeps the old keys
        when any is unusable. A secret no longer accepted is revoked: the answers under way
        under it end at once."""
        # Files are read in a thread: a slow disk must not stall the loop.
        self.keyring = await asyncio.to_thread(self._read_keys, api, instances)
        ended = self.serving.live.accept(self.keyring.identities())
        if ended:
            logger.bind(event="keys-revoked", ended=ended).warning(
                "{} answer(s) under way ended: their key was revoked", ended)

    def _read_keys(self, api: Api, instances: Collection[str]) -> Keyring:
        tokens = [] if self.cfg.token_file is None else [
            digest(t.encode()) for t in read_tokens(self.cfg.token_file)]
        keys = list(api.keys)
        if api.keys_file is not None:
            keys += read_keys_file(api.keys_file, instances, taken=api.keys)
        # The token file is the running API's (a new one takes a restart); the keys, the new.
        return Keyring(keyring_entries(keys, tokens), auth=self.cfg.token_file is not None
                       or auth_configured(replace(api, token_file=None)))

    # ---- lifecycle --------------------------------------------------------------------
    async def start(self, instances: Collection[str]) -> None:
        """Read the keys (which may name `instances`), bind and serve; raises OSError with a
        one-line message (a port in use, a keys file that cannot be used)."""
        await self.load_keys(self.cfg, instances)
        app = web.Application(middlewares=[self._errors, self._browser,
                                           auditor(self.sup.usage), self._auth],
                              client_max_size=self.max_body)
        app.router.add_get("/health", self.health)
        app.router.add_get("/ready", self.ready)
        app.router.add_get("/metrics", self.scrape)
        self.ollama.add_routes(app.router)  # `/` too: the status page, or Ollama's words
        self.ollama_generate.add_routes(app.router)
        app.router.add_get("/status.json", self.status_json)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/models/{model}", self.model)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/messages", self.messages)
        app.router.add_post("/v1/messages/count_tokens", self.count_tokens)
        app.router.add_post("/v1/responses", self.responses)
        app.router.add_post("/v1/embeddings", self.embeddings)
        app.router.add_post("/v1/rerank", self.rerank)
        app.router.add_post("/api/embed", self.ollama_embed)
        app.router.add_post("/api/embeddings", self.ollama_embeddings)
        # keepalive_timeout doubles as the deadline for a request head (see exod.api.guard).
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                                     keepalive_timeout=self.cfg.header_timeout,
                                     max_line_size=8190, max_field_size=8190, max_headers=64,
                                     shutdown_timeout=1.0, logger=quiet_logger(self.ratelog))
        await self._runner.setup()
        for i, (host, port) in enumerate(self.addresses):
            site = GuardedSite(self._runner, host, port, self.guard)
            self._sites.append(site)
            try:
                await site.start()
            except OSError as e:
                await self._runner.cleanup()
                self._runner = None
                code = e.errno or errno.EADDRINUSE
                raise OSError(code, f"HTTP API {self.cfg.listen[i]}: {os.strerror(code)}") \
                    from None
            self.addresses[i] = (host, site.port)  # the real port when listen asked for :0
        logger.info("HTTP API on {}{}", ", ".join(self.urls),
                    " (a key required)" if self.token else "")

    async def stop_listening(self) -> None:
        """At the daemon's stop: no new connection from now on, and none dropped
        (exod.api.stopping). Requests under way go on, answered as the instances stop."""
        answered = 0
        for site in self._sites:
            refusals = await site.stop_listening()
            answered += len(refusals)
            self._refusals += refusals
        if self._sites:
            logger.bind(event="api-closed", answered=answered).info(
                "HTTP API: no longer listening (exod is stopping); {} connection(s) waiting in "
                "its backlog answered 503", answered)
        self._sites.clear()

    async def close(self) -> None:
        if self._runner is not None:
            await self.stop_listening()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + stopping.FIRST_REQUEST
            if self._runner.server is not None:
                await stopping.first_requests(list(self._runner.server.connections),
                                              self.guard.seen, deadline)
            with contextlib.suppress(TimeoutError):  # each is bounded by READ_S already
                await asyncio.wait_for(asyncio.gather(*self._refusals), stopping.READ_S + 1)
            await self._runner.cleanup()
            self._runner = None
        await self.serving.fetcher.close()
        await self.proxy.close()

    @property
    def urls(self) -> list[str]:
        return [listen.url(h, p) for h, p in self.addresses]

    def info(self) -> ApiStatus:
        """For the status snapshot: where exoctl (and people) find the API."""
        urls = self.urls
        return ApiStatus(listen=list(self.cfg.listen), url=urls[0], urls=urls, auth=self.token,
                         token_file=str(self.cfg.token_file) if self.cfg.token_file else None)

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
        return web.json_response(page.status_json(self.sup, self.serving, key_of(request)))

    async def scrape(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(),
                            headers={"Content-Type": METRICS_CONTENT_TYPE})

    # ---- generation -------------------------------------------------------------------
    async def chat(self, request: web.Request) -> web.StreamResponse:
        req = await self.body(request, lambda b: parse_chat(b, self.cfg.strict_fields))
        return await self.generate(request, "chat", req, OpenAiOutput(req))

    async def completions(self, request: web.Request) -> web.StreamResponse:
        req = await self.body(request, lambda b: parse_completion(b, self.cfg.strict_fields))
        return await self.generate(request, "completion", req, OpenAiOutput(req))

    async def messages(self, request: web.Request) -> web.StreamResponse:
        req, view = await self.body(request, lambda b: anthropic.parse(
            b, self.sealer, self.cfg.strict_fields))
        return await self.generate(request, "messages", req,
                                    AnthropicOutput(req.model, view, self.sealer))

    async def count_tokens(self, request: web.Request) -> web.StreamResponse:
        req, _ = await self.body(request, lambda b: anthropic.parse(
            b, self.sealer, self.cfg.strict_fields, count_only=True))
        return await self.generate(request, "messages", req, CountOutput())

    async def responses(self, request: web.Request) -> web.StreamResponse:
        body, (req, view) = await self.body(request, lambda b: (b, responses.parse(
            b, self.sealer, self.cfg.strict_fields)))
        return await self.generate(request, "responses", req,
                                    ResponsesOutput(req.model, body, view, self.sealer))

    async def embeddings(self, request: web.Request) -> web.StreamResponse:
        req = await self.body(request, lambda b: parse_embeddings(b, self.cfg.strict_fields))
        if (sent := await self.elsewhere(request, req.model)) is not None:
            return sent
        got = await self._embed(request, req)
        return await json_answer(openai_embeddings(req, got), _size(got), req.ignored)

    async def rerank(self, request: web.Request) -> web.StreamResponse:
        req = await self.body(request, lambda b: parse_rerank(b, self.cfg.strict_fields))
        if (sent := await self.elsewhere(request, req.model)) is not None:
            return sent
        got = await self._embed(request, req)
        return await json_answer(rerank_answer(req, got), _size(got), req.ignored)

    async def ollama_embed(self, request: web.Request) -> web.StreamResponse:
        return await self._ollama_embed(request, legacy=False)

    async def ollama_embeddings(self, request: web.Request) -> web.StreamResponse:
        return await self._ollama_embed(request, legacy=True)

    async def _ollama_embed(self, request: web.Request, legacy: bool) -> web.StreamResponse:
        arrived = time.monotonic_ns()
        view = await self.body(request, lambda b: ollama_embed.parse(b, legacy,
                                                                     self.cfg.strict_fields))
        if (sent := await self.elsewhere(request, view.req.model)) is not None:
            return sent
        got = await self._embed(request, view.req, view.keep_alive)
        took = time.monotonic_ns() - arrived
        size = _size(got)  # thousands of vectors are normalized off the loop
        body = await asyncio.to_thread(ollama_embed.embed_answer, view, got, took) \
            if size > BIG_ANSWER else ollama_embed.embed_answer(view, got, took)
        return await json_answer(body, size, view.req.ignored)

    async def _embed(self, request: web.Request, req: EmbedRequest,
                     keep_alive: float | None = None) -> Embedded:
        try:
            return await self.embedder.run(request, req, keep_alive)
        except ApiError as e:
            e.headers.update(header(req.ignored))
            raise

    async def generate(self, request: web.Request, dialect: str, req: GenRequest,
                       out: DialectOutput, keep_alive: float | None = None,
                       adapt: Adapt | None = None) -> web.StreamResponse:
        """Serve a checked request; what it ignored is counted, and named in the answer's
        header (an error's too). `adapt`: exod.api.serving.Adapt."""
        self.metrics.ignored.record(dialect, req.ignored)
        if (sent := await self.elsewhere(request, req.model)) is not None:
            return sent
        try:
            return await self.serving.generate(request, req, self.limits, out, keep_alive,
                                               adapt, dialect)
        except ApiError as e:
            e.headers.update(header(req.ignored))
            raise

    async def elsewhere(self, request: web.Request, model: str) -> web.StreamResponse | None:
        """The answer of the node that runs rank 0 of the instance `model` names, relayed
        (exod.api.proxy), when that is not this node; None when this node serves it (or no
        node does). An instance this config does not name goes to the member announcing it.
        The key must see the instance here, and is checked again there (the client's own)."""
        inst, nodes = self.sup.serving(model), self.sup.nodes()
        if inst is None:  # an instance another node announces, if one does
            check_instance(key_of(request), model, model)
            found = upstream.announced(model, nodes, nodes[0].node_id) if nodes else None
            return None if found is None else await self.proxy.forward(request, found, model)
        if inst.served_by is None or not inst.config.hosts:
            return None
        check_instance(key_of(request), inst.name, model)
        to = upstream.choose(inst.served_by, inst.config.hosts[0].address, nodes,
                             self.addresses[0][1])
        return await self.proxy.forward(request, to, inst.name)

    async def body(self, request: web.Request, read: Callable[[Any], T]) -> T:
        """The JSON body as its dialect `read`s it: refused by its announced size before
        anything is read, read within api.body_timeout, and parsed only once admitted among
        BODY_SLOTS (off the loop when big)."""
        size = request.content_length
        if size is not None and size > self.max_body:
            raise ApiError(413, f"The request body is {size} bytes, more than api.max_body_kib "
                                f"({self.cfg.max_body_kib} KiB).", "invalid_request_error",
                           "request_too_large")
        async with self._bodies:
            try:
                raw = await asyncio.wait_for(request.read(), self.cfg.body_timeout)
            except asyncio.TimeoutError:
                raise ApiError(408, "The request body did not arrive within "
                                    f"{self.cfg.body_timeout:g}s.", "invalid_request_error",
                               "request_timeout") from None
            if len(raw) > BIG_BODY:
                return await asyncio.to_thread(lambda: read(parse_json(raw)))
            return read(parse_json(raw))

    async def limits(self, inst: InstanceRuntime) -> ModelLimits:
        """The model's vocabulary and context window, as rank 0 reported them once loaded,
        else from its config.json (as the daemon read it once per instance); and the
        instance's max_tokens_cap."""
        info, cap = inst.model_info, inst.config.max_tokens_cap
        schema = inst.config.grammar.max_schema_kib * 1024
        if info is not None and info.vocab_size > 0 and info.context_length > 0:
            return ModelLimits(info.vocab_size, info.context_length, cap, schema)
        vocab, context = await inst.lane.size()
        return ModelLimits(vocab, context, cap, schema)


def _size(got: Embedded) -> int:
    return sum(map(len, got.results))


def parse_json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError as e:
        raise bad_request(f"the request body is not valid JSON: {e}") from None
    except RecursionError:
        raise bad_request("the request body is not valid JSON: nested too deeply") from None
