"""An instance's `warm:` prompts: files whose prompt the runner prefills into its prompt cache
at start, unless the cache holds it already (an agent's system prompt and tools, so its first
request after a start or an upgrade finds them cached).

A file is either JSON, an object with `messages` (chat turns, as a chat completions request has
them) and optionally `tools` (OpenAI's function tools), or plain text: one system message. Its
prompt is the chat template over those turns without the assistant's turn after them, so that a
later request that goes on from them starts with the same tokens. Pure; read by `exod check`
and the daemon's config loader, and again by the runner.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_BYTES = 16 << 20  # far past any system prompt; a bigger file is no prompt


@dataclass(frozen=True)
class WarmPrompt:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)


def read_warm(path: Path) -> WarmPrompt:
    """The prompt in `path`; ValueError saying what is wrong (OSError: cannot be read)."""
    with open(path, "rb") as f:
        raw = f.read(MAX_BYTES + 1)
    if len(raw) > MAX_BYTES:
        raise ValueError(f"larger than {MAX_BYTES >> 20} MiB")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    if not text.lstrip().startswith("{"):
        if not text.strip():
            raise ValueError("empty")
        return WarmPrompt([{"role": "system", "content": text}])
    try:
        obj = json.loads(text)
    except ValueError as e:
        raise ValueError(f"not valid JSON: {e}") from None
    return _from_json(obj)


def _from_json(obj: Any) -> WarmPrompt:
    unknown = sorted(set(obj) - {"messages", "tools"}) if isinstance(obj, dict) else []
    if not isinstance(obj, dict) or unknown:
        raise ValueError("a JSON warm prompt is an object with `messages` and optionally "
                         "`tools`" + (f" (unknown: {', '.join(unknown)})" if unknown else ""))
    messages, tools = obj.get("messages"), obj.get("tools", [])
    if not isinstance(messages, list) or not messages:
        raise ValueError("`messages` must be a non-empty list")
    for i, msg in enumerate(messages):
        if not (isinstance(msg, dict) and isinstance(msg.get("role"), str)
                and isinstance(msg.get("content"), str)):
            raise ValueError(f"messages[{i}] needs a text `role` and `content`")
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise ValueError("`tools` must be a list of objects")
    return WarmPrompt(messages, tools)
