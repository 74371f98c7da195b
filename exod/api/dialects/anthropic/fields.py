"""Anthropic Messages (`POST /v1/messages`, `/v1/messages/count_tokens`): what exod does with
each field (the mapping is exod.api.dialects.anthropic.request)."""

from __future__ import annotations

from typing import Any

from exod.api.dialects.openai.fields import OTHER_MEDIA, PICTURES
from exod.api.fields import (Dialect, Field, Obj, Variants, empty, ignored, inert, null,
                             refused, works)


def _direct(value: Any) -> bool:
    return value is None or value == {"type": "direct"}


def _direct_only(value: Any) -> bool:
    return value is None or value == ["direct"]


CACHE = inert("a caching hint: exod's prompt cache reuses any prefix without one")
HOSTED_RESULT = ignored("a call or result of a tool Anthropic's servers run: exod runs none, "
                        "so it is left out of the prompt")
HOSTED_TOOL = ignored("a tool Anthropic's servers run (or whose schema is Anthropic's own): "
                      "not offered to the model")
DEFERRED = ignored("`true`: the tool is not offered to the model (a tool search would load it, "
                   "which exod does not run)")
CITATIONS = refused("citations are not supported", empty, "only empty (an answer sent back)")

# The body of count_tokens: what shapes the prompt.
_PROMPT: dict[str, Field] = {
    "model": works("the instance that answers"),
    "messages": works("the conversation: `user`, `assistant` and `system` turns; a `system` "
                      "turn stays where it is when the model's chat template takes it there, "
                      "else joins the system prompt"),
    "system": works("a string or text blocks: the system prompt"),
    "tools": works("custom tools, as chat completions' function tools; tools Anthropic runs "
                   "are not offered (below)"),
    "tool_choice": works("`auto`, `any` (required), `tool` + `name`, `none`; "
                         "`disable_parallel_tool_use`"),
    "thinking": works("the chat template's `enable_thinking` switch (below)"),
    "output_config": works("`format` (a JSON schema the answer follows) and `effort`"),
    "context_management": works("edits of the prompt before it reaches the template (below)"),
    "cache_control": CACHE,
    "speed": inert("Anthropic's fast mode: a local model has one speed"),
    "betas": inert("beta names (the SDK sends them as the `anthropic-beta` header, which is "
                   "accepted too)"),
    **{name: inert(why) for name, why in (
        ("billing_policy", "billing"), ("user_profile_id", "who the request is for"),
        ("workspace_id", "Anthropic's workspaces"))},
    "mcp_servers": refused("Anthropic's MCP connector is not available: exod runs no tools",
                           empty, "refused unless empty"),
    "compaction": refused("compaction (a summary written by the model) is not supported",
                          null, "refused unless null"),
}

MESSAGES = Dialect("messages", "POST /v1/messages", intro=(
    "`/v1/messages/count_tokens` takes the fields that shape the prompt (`model`, `messages`, "
    "`system`, `tools`, `tool_choice`, `thinking`, `output_config`, `context_management`) and "
    "answers `{\"input_tokens\": N}`, with `context_management.original_input_tokens` when an "
    "edit applied."), objects={
    "body": Obj("", {
        **_PROMPT,
        "max_tokens": works("required; a value larger than the context leaves, or than the "
                            "instance's `max_tokens_cap`, is clamped to it (`stop_reason: "
                            "max_tokens`)"),
        "stop_sequences": works("as chat completions' `stop`; a match gives `stop_reason: "
                                "stop_sequence` and names it in `stop_sequence`"),
        "stream": works("Anthropic's named events"),
        "temperature": works("the sampler (0 to 2), plainly or through the SDK's `extra_body`"),
        "top_p": works("the sampler"), "top_k": works("the sampler"),
        "metadata": inert("a caller's own labels (`user_id`)"),
        "service_tier": inert("billing"),
        "inference_geo": inert("where Anthropic runs it"),
        "diagnostics": inert("Anthropic's cache diagnostics"),
        "fallbacks": inert("models tried after a policy refusal: exod refuses nothing so"),
        "fallback_credit_token": inert("billing"),
        "container": refused("code execution containers are Anthropic's", null,
                             "refused unless null"),
        "thread": refused("exod keeps no conversations: send the whole conversation", null,
                          "refused unless null"),
    }),
    "count": Obj("", _PROMPT, "count_tokens' body"),
    "message": Obj("messages[]", {"role": works("`user`, `assistant` or `system`"),
                                  "content": works("a string or content blocks")}),
    "system": Obj("system[]", {"type": works("`text`"), "text": works("joined by blank lines"),
                               "cache_control": CACHE, "citations": CITATIONS},
                  "a system text block"),
    "text": Obj("messages[].content[]", {
        "type": works("`text`"), "text": works("the turn's text"), "cache_control": CACHE,
        "citations": CITATIONS}, "a `text` block"),
    "image": Obj("messages[].content[]", {
        "type": works("`image`, in a user turn"), "source": works("`base64` or `url`"),
        "cache_control": CACHE}, "an `image` block"),
    "base64": Obj("messages[].content[].source", {
        "type": works("`base64`"), "data": works("the picture's bytes"),
        "media_type": inert("the runner reads the format from the bytes")},
        "a `base64` source"),
    "url": Obj("messages[].content[].source", {
        "type": works("`url`"), "url": works("an http(s) URL that exod fetches (or a `data:` "
                                            "URL)")}, "a `url` source"),
    "tool_use": Obj("messages[].content[]", {
        "type": works("`tool_use`: an assistant's call, kept as a tool call for the template"),
        "id": works("the call's id"), "name": works("the tool"),
        "input": works("an object: the call's arguments"), "cache_control": CACHE,
        "caller": refused("only calls the model made itself can be replayed", _direct,
                          "only `{type: direct}`"),
        "toolset_name": refused("toolsets are Anthropic's", empty, "only empty")},
        "a `tool_use` block"),
    "tool_result": Obj("messages[].content[]", {
        "type": works("`tool_result`: a tool message, placed before the turn's text"),
        "tool_use_id": works("the call it answers"),
        "content": works("a string or text blocks"),
        "is_error": works("`true` prefixes `Error: `, which reaches the prompt"),
        "cache_control": CACHE,
        "toolset_name": refused("toolsets are Anthropic's", empty, "only empty")},
        "a `tool_result` block"),
    "thinking": Obj("messages[].content[]", {
        "type": works("`thinking`: the turn's `reasoning_content`, for templates that show it"),
        "thinking": works("the reasoning; empty (as `display: omitted` returns it): the "
                          "signature's"),
        "signature": works("exod's signature holds the reasoning, sealed: an empty `thinking` "
                           "with a valid one gets its text back; a foreign one is ignored, "
                           "reported")}, "a `thinking` block"),
    "redacted_thinking": Obj("messages[].content[]", {
        "type": works("`redacted_thinking`: no text a local model could read; left out"),
        "data": inert("Anthropic's encrypted thinking")}, "a `redacted_thinking` block"),
    "tool": Obj("tools[]", {
        "type": works("`custom` (or absent)"),
        "name": works("1 to 64 letters, digits, `_`, `.` or `-`"),
        "description": works("reaches the template"),
        "input_schema": works("required: the JSON schema of the input"),
        "strict": works("as chat completions' `strict`"),
        "cache_control": CACHE,
        "eager_input_streaming": inert("exod streams a call's input as it is decoded"),
        "defer_loading": DEFERRED,
        "input_examples": refused("input examples are not supported", empty, "only empty"),
        "allowed_callers": refused("only the model itself calls tools here", _direct_only,
                                   "only `[\"direct\"]`")}, "a custom tool"),
    "tool_choice": Obj("tool_choice", {
        "type": works("`auto`, `any` (a call is required), `tool`, `none`"),
        "name": works("with `tool`: the tool to call"),
        "disable_parallel_tool_use": works("`true`: the generation ends after the first "
                                           "call")}),
    "thinking_config": Obj("thinking", {
        "type": works("`enabled`, `adaptive`: the template's `enable_thinking` on, the answer "
                      "starts with a `thinking` block; `disabled`: off"),
        "budget_tokens": works("with `enabled`: a positive integer below `max_tokens`; the "
                               "runner closes the think block past it"),
        "display": works("`summarized`: the thinking comes back whole; `omitted`: thinking "
                         "blocks come back with an empty `thinking` and the signature (no "
                         "`thinking_delta` when streamed)"),
        "block_binding": inert("what Anthropic does with a block that fails its check")},
        "`thinking`"),
    "output_config": Obj("output_config", {
        "format": works("`{type: json_schema, schema}`: enforced by a grammar"),
        "effort": works("`low`: thinking off; `medium` and up: on (`thinking` wins when both "
                        "are given): a local template has one switch"),
        "task_budget": refused("task budgets are not supported", null,
                               "refused unless null")}),
    "format": Obj("output_config.format", {"type": works("`json_schema`"),
                                          "schema": works("the JSON schema")}),
    "context_management": Obj("context_management", {
        "edits": works("applied in order to the prompt (not to the client's history), by the "
                       "runner, which counts the model's own tokens; the answer reports "
                       "`context_management.applied_edits`")}),
    "clear_thinking": Obj("context_management.edits[]", {
        "type": works("`clear_thinking_20251015`"),
        "keep": works("`{type: thinking_turns, value: N}` (default 1) or `all`: the thinking "
                      "of older assistant turns is left out")},
        "`clear_thinking_20251015`"),
    "clear_tool_uses": Obj("context_management.edits[]", {
        "type": works("`clear_tool_uses_20250919`"),
        "trigger": works("`{type: input_tokens | tool_uses, value}` (default 100,000 input "
                         "tokens): past it, the edit applies"),
        "keep": works("`{type: tool_uses, value}` (default 3): the latest results kept"),
        "clear_at_least": works("`{type: input_tokens, value}`: applied only if it frees that "
                                "many tokens"),
        "exclude_tools": works("tools whose results are never cleared"),
        "clear_tool_inputs": works("`true` (or a list of tools): their calls' inputs are "
                                   "cleared too")},
        "`clear_tool_uses_20250919`"),
    **{f"amount.{key}": Obj(f"context_management.edits[].{key}", {
        "type": works(f"the unit: {units}"), "value": works("required: a count, 0 or more")},
        f"`{key}` of an edit") for key, units in (
        ("keep", "`thinking_turns` (`clear_thinking`, or `all`), `tool_uses`"),
        ("trigger", "`input_tokens` or `tool_uses`"), ("clear_at_least", "`input_tokens`"))},
}, variants={
    "block": Variants("messages[].content[].type", {
        **{kind: works("see its keys") for kind in ("text", "tool_use", "tool_result",
                                                     "thinking", "redacted_thinking")},
        "image": works(PICTURES),
        **{kind: refused(OTHER_MEDIA) for kind in ("document", "search_result",
                                                   "container_upload")},
        **{kind: HOSTED_RESULT for kind in (
            "server_tool_use", "web_search_tool_result", "web_fetch_tool_result",
            "advisor_tool_result", "code_execution_tool_result",
            "bash_code_execution_tool_result", "text_editor_code_execution_tool_result",
            "tool_search_tool_result", "mcp_tool_use", "mcp_tool_result", "mcp_tool_listing",
            "tool_addition", "tool_removal")},
        "compaction": refused("compaction summaries are not supported"),
        "fallback": inert("a marker of Anthropic's model fallback"),
    }),
    "system": Variants("system[].type", {
        "text": works("joined"),
        "image": refused("a picture belongs to a user turn"),
        **{kind: refused(OTHER_MEDIA) for kind in ("document", "search_result")}}),
    "result": Variants("messages[].content[].content[].type", {
        "text": works("joined"),
        "image": refused("a tool result's pictures are not supported: show them in a user "
                         "turn's `image` block"),
        **{kind: refused(OTHER_MEDIA) for kind in ("document", "search_result")}}),
    "source": Variants("messages[].content[].source.type", {
        "base64": works("the picture's bytes"), "url": works("a URL exod fetches"),
        "file": refused("files are not supported: send the picture's bytes or its URL")}),
    "tool": Variants("tools[].type", {
        "custom": works("a tool the client runs"),
        **{kind: HOSTED_TOOL for kind in (
            "bash_*", "code_execution_*", "browser_toolset_*", "computer_*", "memory_*",
            "text_editor_*", "web_search_*", "web_fetch_*", "advisor_*", "tool_search_tool_*",
            "mcp_toolset")},
    }),
    "edit": Variants("context_management.edits[].type", {
        "clear_thinking_20251015": works("see its keys"),
        "clear_tool_uses_20250919": works("see its keys"),
        "compact_*": refused("compaction (a summary written by the model) is not supported"),
    }),
})
