"""Lines an operator asks exod to drop from system prompts (an instance's `drop_system_lines`):
per-request or per-session text that an agent writes atop its system prompt for its own vendor,
which changes what the prompt cache can reuse and nothing the model needs.

Why not match around it: the KV of every token after a changed line depends on that line, so no
entry made before the change serves the tokens after it exactly, and the prompt cache matches
exact token prefixes only (exod.runner.prompt_cache.index). The remedy is on the prompt's side,
and it is the operator's choice: off unless configured, documented in docs/prompt-cache.md.
Claude Code's case, the reason this exists, is there too (its billing line differs in every
session): dropped here, the prompt is the one Claude Code itself sends when
`CLAUDE_CODE_ATTRIBUTION_HEADER=0` turns the line off, since a dropped line takes the blank
lines after it (or, last, those before it) with it, as a block never sent would have.

Pure text: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

SYSTEM = "system"  # Responses' `developer` turns are system turns by the time they come here


def drop_lines(text: str, prefixes: Sequence[str]) -> str:
    """`text` without its lines that start with one of `prefixes`, and the blank lines that
    separated each from the rest."""
    if not any(p in text for p in prefixes):  # the common case: nothing to look at
        return text
    lines = text.split("\n")
    kept: list[str] = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith(tuple(prefixes)):
            kept.append(lines[i])
            i += 1
            continue
        i += 1
        while i < len(lines) and lines[i] == "":  # its separator from what follows
            i += 1
        if i == len(lines):  # the last line: the separator before it goes instead
            while kept and kept[-1] == "":
                kept.pop()
    return "\n".join(kept)


def _content(content: Any, prefixes: Sequence[str]) -> Any:
    """A turn's content (text, or a list of parts) without the lines; None: nothing left."""
    if isinstance(content, str):
        left = drop_lines(content, prefixes)
        return left if left else None
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text" \
                    and isinstance(part.get("text"), str):
                text = drop_lines(part["text"], prefixes)
                if not text:
                    continue  # a part that held only such lines, as if never sent
                part = {**part, "text": text}
            parts.append(part)
        return parts or None
    return content


def drop_system_lines(messages: list[dict[str, Any]], prefixes: Sequence[str]
                      ) -> list[dict[str, Any]]:
    """The turns with those lines dropped from every system turn (a turn left empty goes);
    the same list when nothing was dropped."""
    if not prefixes:
        return messages
    out: list[dict[str, Any]] = []
    changed = False
    for msg in messages:
        if msg.get("role") != SYSTEM:
            out.append(msg)
            continue
        content = _content(msg.get("content"), prefixes)
        if content is None:
            changed = True
            continue
        if content is not msg.get("content") and content != msg.get("content"):
            changed = True
            msg = {**msg, "content": content}
        out.append(msg)
    return out if changed else messages

