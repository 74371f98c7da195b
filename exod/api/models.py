"""/v1/models and /v1/models/{model}: every instance in the shapes OpenAI's and Anthropic's
clients read, with what they size themselves by (context window, capabilities), and the
instances other nodes of the cluster announce (served through them: exod.api.proxy). A mixin of
`exod.api.app.ApiServer`, kept apart so each module stays one job."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from aiohttp import web

from exod.api.access import check_instance, key_of
from exod.api.errors import model_not_found
from exod.api.request import ModelLimits
from exod.api.view import DaemonView
from exod.core import upstream
from exod.core.keys import ApiKey
from exod.facts.embed import Encoding, encoding
from exod.facts.caps import Capabilities

if TYPE_CHECKING:
    from exod.daemon.instance import InstanceRuntime


class ModelList:
    sup: DaemonView
    started_wall: int

    if TYPE_CHECKING:  # ApiServer's
        async def limits(self, inst: InstanceRuntime) -> ModelLimits: ...

        async def elsewhere(self, request: web.Request, model: str
                            ) -> web.StreamResponse | None: ...

    def cluster_instances(self, key: ApiKey) -> dict[str, str]:
        """The instances other nodes announce that this node's config does not name, which
        `key` may use, each with the node that serves it."""
        nodes = self.sup.nodes()
        if not nodes:
            return {}
        found = upstream.elsewhere(nodes, nodes[0].node_id, self.sup.instances)
        return {name: node for name, node in found.items() if key.sees(name)}

    def _remote_json(self, name: str, node: str) -> dict[str, Any]:
        """An instance another node serves, as far as this node knows it (its own node's
        /v1/models/{model} says the rest)."""
        created = datetime.fromtimestamp(self.started_wall, timezone.utc)
        return {"id": name, "object": "model", "created": self.started_wall,
                "owned_by": "exod", "type": "model", "display_name": name,
                "created_at": created.isoformat().replace("+00:00", "Z"), "node": node}

    async def _model_json(self, inst: InstanceRuntime) -> dict[str, Any]:
        """One instance in the shapes both OpenAI's and Anthropic's clients read (`object`,
        `owned_by` / `type`, `display_name`, `created_at`), with its state, and what clients
        size themselves by: the context window under the names clients read
        (`context_length`, vLLM's `max_model_len`, Anthropic's `max_input_tokens` and
        `max_tokens`) and capabilities (Anthropic's object; OpenRouter's
        `supported_parameters`), from the model's files."""
        active, queued = inst.lane.load()
        created = datetime.fromtimestamp(self.started_wall, timezone.utc)
        head = {"id": inst.name, "object": "model", "created": self.started_wall,
                "owned_by": "exod", "type": "model", "display_name": inst.name,
                "created_at": created.isoformat().replace("+00:00", "Z"),
                "state": inst.state.value}
        tail = {"active": active, "queued": queued}
        serves = await inst.lane.serves()
        if serves in ("embed", "rerank"):
            enc = await asyncio.to_thread(encoding, inst.config.model)
            if enc is not None:
                return {**head, **encoder_json(enc), **tail}
        limits = await self.limits(inst)
        caps = await inst.lane.capabilities()
        most = min(x for x in (limits.context, limits.cap) if x is not None) \
            if limits.context is not None or limits.cap is not None else None
        return {**head, "serves": "chat" if serves else None, "context_length": limits.context,
                "max_model_len": limits.context, "max_input_tokens": limits.context,
                "max_tokens": most, "capabilities": capabilities(caps),
                "supported_parameters": supported_parameters(caps),
                "architecture": {"input_modalities": ["text", "image"] if caps.vision
                                 else ["text"], "output_modalities": ["text"]}, **tail}

    async def models(self, request: web.Request) -> web.Response:
        key = key_of(request)
        data = [await self._model_json(i) for i in self.sup.ordered() if key.sees(i.name)]
        data += [self._remote_json(n, node) for n, node in self.cluster_instances(key).items()]
        return web.json_response({"object": "list", "data": data, "has_more": False,
                                  "first_id": data[0]["id"] if data else None,
                                  "last_id": data[-1]["id"] if data else None})

    async def model(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["model"]
        inst = self.sup.serving(name)
        if inst is None:
            sent = await self.elsewhere(request, name)  # another node's, its own words
            if sent is not None:
                return sent
            raise model_not_found(name)
        check_instance(key_of(request), inst.name, name)
        return web.json_response(await self._model_json(inst))


def encoder_json(enc: Encoding) -> dict[str, Any]:
    """What /v1/models says of an embedding model or a reranker: what it serves, the longest
    input, and an embedding model's vector size and the sizes it may be cut to."""
    out: dict[str, Any] = {"serves": "embeddings" if enc.role == "embed" else "rerank",
                           "context_length": enc.max_tokens, "max_input_tokens": enc.max_tokens}
    if enc.role == "embed":
        out["dimensions"] = enc.dimensions
        out["matryoshka_dimensions"] = list(enc.matryoshka) \
            if isinstance(enc.matryoshka, tuple) else enc.matryoshka
    return out


def capabilities(caps: Capabilities) -> dict[str, Any]:
    """Anthropic's capability object (each `{supported}`), with `tools` beside its own keys;
    null where the model's files do not tell."""
    def yes(value: bool | None) -> dict[str, Any]:
        return {"supported": value}
    thinking = caps.thinking
    return {"tools": yes(caps.tools), "structured_outputs": yes(True),
            "thinking": {"supported": thinking,
                         "types": {"enabled": yes(thinking), "adaptive": yes(thinking)}},
            "effort": {"supported": thinking, **{e: yes(thinking) for e in (
                "low", "medium", "high", "max")}},
            "context_management": {"supported": True},
            "vision": yes(caps.vision), "image_input": yes(caps.vision),
            **{name: yes(False) for name in ("pdf_input", "citations", "code_execution",
                                             "batch")}}


def supported_parameters(caps: Capabilities) -> list[str]:
    """OpenRouter's list of the request fields a model takes (read by opencode and others)."""
    out = ["max_tokens", "temperature", "top_p", "top_k", "min_p", "stop", "seed",
           "logit_bias", "logprobs", "top_logprobs", "frequency_penalty", "presence_penalty",
           "repetition_penalty", "response_format", "structured_outputs"]
    if caps.tools:
        out += ["tools", "tool_choice", "parallel_tool_calls"]
    if caps.thinking:
        out += ["reasoning", "include_reasoning"]
    return out
