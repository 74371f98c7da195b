"""The objects Ollama's read-only endpoints answer, from an instance's model files
(exod.facts.details, exod.facts.caps) and its state. Pure.

Copilot reads `/api/version` as integers and wants at least 0.6.4; it lists a model only when
/api/show has `model_info` with `general.architecture` and `<arch>.context_length`, and
`capabilities` with `tools` for its agent mode.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from exod.api.errors import ApiError
from exod.facts.caps import Capabilities
from exod.facts.details import ModelFacts

# The Ollama API whose shapes exod answers in (think, tools, structured outputs, keep_alive).
API_VERSION = "0.12.0"
FOREVER = 2**63 / 1e9  # Go's longest duration, in seconds: what Ollama shows for `-1`


def timestamp(epoch: float) -> str:
    """RFC 3339, as Ollama's clients parse it."""
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat().replace("+00:00", "Z")


def details(facts: ModelFacts) -> dict[str, Any]:
    family = facts.family
    return {"parent_model": "", "format": "safetensors", "family": family,
            "families": [family] if family else None,
            "parameter_size": facts.parameter_size, "quantization_level": facts.quantization}


def tag(name: str, facts: ModelFacts) -> dict[str, Any]:
    """One model of /api/tags (an instance, by its name)."""
    return {"name": name, "model": name, "modified_at": timestamp(facts.modified),
            "size": facts.size, "digest": facts.digest, "details": details(facts)}


def capabilities(caps: Capabilities, sees: bool = False) -> list[str]:
    out = ["completion"]
    if sees:
        out.append("vision")  # the vision runner takes a message's `images`
    if caps.tools:
        out.append("tools")
    if caps.thinking:
        out.append("thinking")
    if caps.fim is not None:
        out.append("insert")  # /api/generate's `suffix`
    return out


def model_info(facts: ModelFacts, context: int | None) -> dict[str, Any]:
    """GGUF's key names, which Ollama's clients read: the architecture and its sizes."""
    arch = facts.family or "unknown"
    out: dict[str, Any] = {"general.architecture": arch}
    if facts.parameters is not None:
        out["general.parameter_count"] = facts.parameters
    for key, value in (("context_length", context or facts.context_length),
                       ("embedding_length", facts.embedding_length),
                       ("block_count", facts.block_count),
                       ("attention.head_count", facts.head_count),
                       ("attention.head_count_kv", facts.head_count_kv),
                       ("vocab_size", facts.vocab_size)):
        if value is not None:
            out[f"{arch}.{key}"] = value
    return out


def show(facts: ModelFacts, caps: Capabilities, template: str | None, source: str,
         context: int | None, sees: bool = False) -> dict[str, Any]:
    """/api/show: `source` is where the model comes from (a directory, or hf:ORG/NAME);
    `sees`: a model the vision runner serves."""
    return {"modelfile": f"# exod serves this model as it is; Modelfiles do not apply\n"
                         f"FROM {source}\n",
            "parameters": "", "template": template or "", "details": details(facts),
            "model_info": model_info(facts, context),
            "capabilities": capabilities(caps, sees),
            "modified_at": timestamp(facts.modified)}


def running(name: str, facts: ModelFacts, size: int, expires: float, context: int | None,
            unified: bool) -> dict[str, Any]:
    """One model of /api/ps: `size` the memory it holds, `expires` when its idle stop is due
    (epoch seconds), `unified`: its memory is the GPU's too (Apple silicon)."""
    return {"name": name, "model": name, "size": size, "digest": facts.digest,
            "details": details(facts), "expires_at": timestamp(expires),
            "size_vram": size if unified else 0, "context_length": context}


def error_text(e: ApiError) -> str:
    """Ollama's error is its text alone (`{"error": TEXT}`): the field at fault goes into it,
    unless it is there already; a message in Ollama's own words stands as it is."""
    if "ollama" in e.in_dialect:
        return e.said("ollama")
    if e.param and f"`{e.param}`" not in e.message:
        return f"`{e.param}`: {e.message}"
    return e.message
