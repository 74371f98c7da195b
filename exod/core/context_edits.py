"""Anthropic's context editing (`context_management.edits`), as deterministic edits of the
conversation a chat template receives: the thinking of older assistant turns left out
(`clear_thinking_20251015`), the results of older tool calls replaced by a placeholder
(`clear_tool_uses_20250919`). The client keeps its whole history; only the prompt changes.

`edit` checks one edit of a request (the daemon, naming the field at fault) into its plain
form, which travels in `Generate.context_edits`; `apply` runs them in the runner, where a
conversation's length in the model's own tokens is known (`count`, asked only when an edit
needs it: a trigger in input tokens, `clear_at_least`, the tokens each edit freed). Pure
logic: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from exod.core.request_rules.base import (RequestError, array, integer, obj, one_of,
                                          required, text_field)

THINKING = "clear_thinking_20251015"
TOOL_USES = "clear_tool_uses_20250919"
PLACEHOLDER = "[tool result cleared]"  # what a cleared result reads in the prompt
DEFAULT_TRIGGER = ("input_tokens", 100_000)  # Anthropic's defaults
DEFAULT_KEEP_TOOL_USES = 3
DEFAULT_KEEP_THINKING = 1
MOST = (1 << 31) - 1
AMOUNTS = ("keep", "trigger", "clear_at_least")  # an edit's `{type: UNIT, value: N}` objects
Messages = list[dict[str, Any]]
Count = Callable[[Messages], int]  # a conversation's prompt length in tokens


# ---- the rules of an edit (the daemon) ---------------------------------------------------------
def edit(raw: Any, kind: str, param: str) -> dict[str, Any]:
    """One edit (`kind`: its type, already known to be one of the two) in its plain form."""
    obj(raw, param)
    if kind == THINKING:
        keep = raw.get("keep")
        if keep == "all" or (isinstance(keep, dict) and keep.get("type") == "all"):
            return {"type": THINKING, "keep": -1}
        return {"type": THINKING, "keep": _amount(keep, f"{param}.keep", ("thinking_turns",),
                                                  DEFAULT_KEEP_THINKING)}
    trigger = raw.get("trigger")
    unit = "input_tokens"
    if trigger is not None:
        unit = one_of(obj(trigger, f"{param}.trigger").get("type"),
                      ("input_tokens", "tool_uses"), f"{param}.trigger.type")
    inputs = raw.get("clear_tool_inputs")
    if inputs is not None and not isinstance(inputs, bool):
        inputs = _names(inputs, f"{param}.clear_tool_inputs")
    return {"type": TOOL_USES,
            "trigger": [unit, DEFAULT_TRIGGER[1] if trigger is None
                        else _amount(trigger, f"{param}.trigger", (unit,), 0)],
            "keep": _amount(raw.get("keep"), f"{param}.keep", ("tool_uses",),
                            DEFAULT_KEEP_TOOL_USES),
            "clear_at_least": _amount(raw.get("clear_at_least"), f"{param}.clear_at_least",
                                      ("input_tokens",), 0),
            "exclude_tools": _names(raw.get("exclude_tools") or [], f"{param}.exclude_tools"),
            "clear_tool_inputs": inputs or False}


def _amount(raw: Any, param: str, units: tuple[str, ...], default: int) -> int:
    """`{type: UNIT, value: N}`: N (`default` when the object is not given; given, it says N)."""
    if raw is None:
        return default
    one_of(obj(raw, param).get("type"), units, f"{param}.type")
    return integer(required(raw.get("value"), f"{param}.value"), f"{param}.value", default, 0,
                   MOST)


def _names(raw: Any, param: str) -> list[str]:
    return [text_field(x, f"{param}[{i}]") for i, x in enumerate(array(raw, param, 1024))]


def system_first(messages: Messages) -> Messages:
    """Every system turn joined (by blank lines, in order) into one leading system turn: what
    a template that takes a system turn only first can render (the runner tries the
    conversation as it is first). The same list when there is nothing to move."""
    if all(m["role"] != "system" for m in messages[1:]):
        return messages
    system = [m["content"] for m in messages if m["role"] == "system"]
    return [{"role": "system", "content": "\n\n".join(system)},
            *(m for m in messages if m["role"] != "system")]


# ---- applying them (the runner) ----------------------------------------------------------------
def apply(messages: Messages, edits: Sequence[dict[str, Any]],
          count: Count) -> tuple[Messages, list[dict[str, Any]]]:
    """The conversation after `edits`, in order, and Anthropic's report of those that changed
    it (`applied_edits`)."""
    applied: list[dict[str, Any]] = []
    # Counting is the chat template and the tokenizer over the whole conversation (2 s for 0.7
    # MB): each conversation is counted once, and an edit the same as one already tried on it
    # is not tried again. 16 edits that never applied counted 48 times (82 s instead of 2).
    counted: list[tuple[Messages, int]] = []
    tried: list[dict[str, Any]] = []

    def measured(msgs: Messages) -> int:
        for known, n in counted:
            if known is msgs:
                return n
        counted.append((msgs, count(msgs)))
        return counted[-1][1]

    for e in edits:
        if e in tried:
            continue
        tried.append(e)
        if e["type"] == THINKING:
            edited, cleared = clear_thinking(messages, e["keep"])
            report = {"type": THINKING, "cleared_thinking_turns": cleared}
        elif e["type"] == TOOL_USES:
            edited, cleared = clear_tool_uses(messages, e, measured)
            report = {"type": TOOL_USES, "cleared_tool_uses": cleared}
        else:
            raise RequestError(f"unknown context edit {e['type']!r}", "context_management")
        if not cleared:
            continue
        freed = measured(messages) - measured(edited)
        if e["type"] == TOOL_USES and freed < e["clear_at_least"]:
            continue  # Anthropic's rule: the context changes only if that many tokens go
        applied.append({**report, "cleared_input_tokens": max(0, freed)})
        messages = edited
        tried = []  # a new conversation: every edit may change it
    return messages, applied


def clear_thinking(messages: Messages, keep: int) -> tuple[Messages, int]:
    """The reasoning of every assistant turn but the last `keep` (-1: all kept) left out."""
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    older = turns if keep == 0 else [] if keep < 0 else turns[:-keep]
    cleared = [i for i in older if messages[i].get("reasoning_content")]
    if not cleared:
        return messages, 0
    out = list(messages)
    for i in cleared:
        out[i] = {k: v for k, v in out[i].items() if k != "reasoning_content"}
    return out, len(cleared)


def clear_tool_uses(messages: Messages, e: dict[str, Any], count: Count) -> tuple[Messages, int]:
    """Once the trigger is passed, the results of every tool call but the last `keep` (and
    those of `exclude_tools`) replaced by a placeholder; with `clear_tool_inputs`, their
    calls' arguments emptied too."""
    uses = [(i, j, call) for i, m in enumerate(messages) if m["role"] == "assistant"
            for j, call in enumerate(m.get("tool_calls") or [])]
    unit, threshold = e["trigger"]
    size = len(uses) if unit == "tool_uses" else count(messages)
    if size <= threshold:
        return messages, 0
    keep = e["keep"]
    older = uses[:-keep] if keep else uses
    chosen = [(i, j, call) for i, j, call in older
              if call["function"]["name"] not in e["exclude_tools"]]
    if not chosen:
        return messages, 0
    ids = {call.get("id") for _, _, call in chosen if call.get("id")}
    inputs = e["clear_tool_inputs"]
    out = list(messages)
    changed: set[str | None] = set()
    for k, m in enumerate(out):
        if m["role"] == "tool" and m.get("tool_call_id") in ids:
            out[k] = {**m, "content": PLACEHOLDER}
            changed.add(m["tool_call_id"])
    for i, j, call in chosen:
        if inputs is True or (isinstance(inputs, list) and call["function"]["name"] in inputs):
            calls = list(out[i]["tool_calls"])
            calls[j] = {**call, "function": {**call["function"], "arguments": {}}}
            out[i] = {**out[i], "tool_calls": calls}
            changed.add(call.get("id") or f"{i}.{j}")
    return (out, len(changed)) if changed else (messages, 0)
