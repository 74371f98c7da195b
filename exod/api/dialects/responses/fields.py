"""OpenAI Responses (`POST /v1/responses`, stateless): what exod does with each field (the
mapping is exod.api.dialects.responses.request)."""

from __future__ import annotations

from typing import Any

from exod.api.dialects.openai.fields import OTHER_MEDIA, PICTURES
from exod.api.dialects.anthropic.fields import DEFERRED
from exod.api.fields import (Dialect, Field, Obj, Variants, empty, false, ignored, inert,
                             null, refused, works)

STATELESS = "exod's Responses API is stateless: it keeps no responses"
HOSTED_TOOL = ignored("a tool OpenAI's servers run (or one that is not a function): not "
                      "offered to the model")
HOSTED_ITEM = ignored("a call or result of a tool exod does not run: left out of the prompt")
ECHO = inert("what exod's own output items carry, sent back as they came")


def _direct(value: Any) -> bool:
    return value is None or value == {"type": "direct"}


def _medium(value: Any) -> bool:
    return value is None or value == "medium"


def _disabled(value: Any) -> bool:
    return value is None or value == "disabled"


_FUNCTION: dict[str, Field] = {
    "type": works("`function`"), "name": works("1 to 64 letters, digits, `_`, `.` or `-`"),
    "description": works("reaches the template"),
    "parameters": works("a JSON schema: reaches the template; followed by forced calls"),
    "strict": works("as chat completions' `strict`"),
    "defer_loading": DEFERRED,
}
_CALL_KEYS: dict[str, Field] = {
    "id": ECHO, "status": ECHO,
    "caller": refused("only calls the model made itself can be replayed", _direct,
                      "only `{type: direct}`"),
    "namespace": works("the namespace of the function called: the template sees the name the "
                       "model was offered (`namespace__name`)"),
}

RESPONSES = Dialect("responses", "POST /v1/responses", intro=(
    "exod keeps nothing: send the whole conversation in `input` each time."), objects={
    "body": Obj("", {
        "model": works("the instance that answers"),
        "input": works("a string (one user turn) or items (below)"),
        "instructions": works("the system prompt, first"),
        "max_output_tokens": works("as chat completions' `max_tokens` (clamped to what the "
                                   "context leaves and to `max_tokens_cap`; `status: "
                                   "incomplete` when it ends the answer)"),
        "temperature": works("the sampler"), "top_p": works("the sampler"),
        "stream": works("OpenAI's `response.*` events"),
        "tools": works("function and namespace tools; tools OpenAI runs are not offered "
                       "(below)"),
        "tool_choice": works("`none`, `auto`, `required` or `{type: function, name}`"),
        "parallel_tool_calls": works("`false`: the generation ends after the first call"),
        "text": works("`format` (chat completions' `response_format`), `verbosity`"),
        "reasoning": works("`effort`: the template's `enable_thinking` (`none`, `minimal`: "
                           "off; `low` and up: on); the output starts with a `reasoning` "
                           "item holding the thinking; `summary` has no effect (the "
                           "reasoning comes back whole)"),
        "include": works("`reasoning.encrypted_content`: reasoning items carry it (below)"),
        "store": refused(f"`store: true` is not supported: {STATELESS} (send `store: false` "
                         "and the whole conversation in `input`)", false,
                         "only false: exod keeps no responses"),
        "previous_response_id": refused(f"it is not supported: {STATELESS} (send the whole "
                                        "conversation in `input`)", null, "refused unless null"),
        "conversation": refused(f"it is not supported: {STATELESS} (send the whole "
                                "conversation in `input`)", null, "refused unless null"),
        "background": refused("`background: true` is not supported: responses are answered "
                              "on the request's own connection", false, "only false"),
        "truncation": refused("it must be disabled: exod never drops part of the conversation;"
                              " a prompt beyond the context window is refused", _disabled,
                              "only `disabled`"),
        "prompt": refused("stored prompts are OpenAI's", null, "refused unless null"),
        "top_logprobs": refused("logprobs are not returned here (chat completions has them)",
                                lambda v: v in (None, 0), "refused unless 0"),
        "moderation": refused("moderation is not supported", null, "refused unless null"),
        "context_management": refused("compaction (a summary written by the model) is not "
                                      "supported", empty, "refused unless empty"),
        **{name: inert(why) for name, why in (
            ("metadata", "a caller's own labels"), ("user", "who the user is"),
            ("safety_identifier", "who the user is"),
            ("client_metadata", "a client's own labels (Codex's session ids)"),
            ("prompt_cache_key", "a caching hint: exod's prompt cache is automatic"),
            ("prompt_cache_retention", "a caching hint"),
            ("prompt_cache_options", "a caching hint"), ("service_tier", "billing"),
            ("stream_options", "exod's events carry no padding"),
            ("max_tool_calls", "a bound on the calls of tools OpenAI runs: exod runs none"),
            ("background_options", "options of background responses"),
            ("image", "image generation options"), ("access_programs", "OpenAI's programs"))},
    }),
    "message": Obj("input[]", {
        "type": works("`message` (or absent)"),
        "role": works("`user`, `assistant`, `system`, `developer` (as `system`)"),
        "content": works("a string or `input_text` / `output_text` / `input_image` parts"),
        "id": ECHO, "status": ECHO, "phase": inert("a message's label")},
        "a `message` item"),
    "part": Obj("input[].content[]", {
        "type": works("`input_text` or `output_text`"), "text": works("joined"),
        "annotations": refused("annotations (citations) are not supported", empty,
                               "only empty (an answer sent back)"),
        "logprobs": ECHO, "prompt_cache_breakpoint": inert("a caching hint")}, "a text part"),
    "image_part": Obj("input[].content[]", {
        "type": works("`input_image`"),
        "image_url": works("a `data:` URL (base64) or an http(s) URL"),
        "detail": inert("the model's processor sizes the picture as it was trained to"),
        "file_id": refused("files are not supported: send the picture in `image_url`", null,
                           "refused unless null"),
        "prompt_cache_breakpoint": inert("a caching hint")}, "an `input_image` part"),
    "function_call": Obj("input[]", {
        "type": works("`function_call`: joins the assistant turn before it"),
        "call_id": works("the call's id"), "name": works("the function"),
        "arguments": works("JSON text"), **_CALL_KEYS}, "a `function_call` item"),
    "function_call_output": Obj("input[]", {
        "type": works("`function_call_output`: a tool message"),
        "call_id": works("the call it answers"),
        "output": works("a string or text parts"),
        "name": works("the function, for templates that show it"), **_CALL_KEYS},
        "a `function_call_output` item"),
    "reasoning": Obj("input[]", {
        "type": works("`reasoning`: the next assistant turn's `reasoning_content`"),
        "content": works("`reasoning_text` parts: the reasoning"),
        "summary": works("`summary_text` parts: the reasoning when there is no `content`"),
        "encrypted_content": works("exod's own holds the reasoning, sealed: without `content`, "
                                   "its text reaches the prompt; another server's (or an "
                                   "altered one) is ignored, reported"),
        "id": ECHO, "status": ECHO}, "a `reasoning` item"),
    "tool": Obj("tools[]", _FUNCTION, "a `function` tool"),
    "namespace": Obj("tools[]", {
        "type": works("`namespace`: its functions are offered as `NAMESPACE__NAME`; a call "
                      "comes back as a `function_call` with `name` and `namespace` apart"),
        "name": works("the namespace"), "description": inert("no template takes it"),
        "tools": works("function tools (their keys as above)")}, "a `namespace` tool"),
    "nested": Obj("tools[].tools[]", _FUNCTION, "a namespace's function"),
    "tool_choice": Obj("tool_choice", {"type": works("`function`"),
                                       "name": works("a function in `tools`"),
                                       "namespace": works("the namespace of that function")}),
    "text": Obj("text", {
        "format": works("`text`, `json_object` or `json_schema`: enforced by a grammar"),
        "verbosity": refused("a local model has no verbosity setting", _medium,
                             "only `medium`")}),
    "format": Obj("text.format", {
        "type": works("`text`, `json_object` or `json_schema`"),
        "name": works("with `json_schema`"), "schema": works("the JSON schema"),
        "strict": works("as chat completions'"), "description": inert("no template takes it")}),
    "reasoning_config": Obj("reasoning", {
        "effort": works("`none`, `minimal`: thinking off; `low`, `medium`, `high`, `xhigh`: "
                        "on"),
        "summary": inert("exod returns the reasoning whole, not summarized"),
        "generate_summary": inert("the older name of `summary`")}, "`reasoning`"),
}, variants={
    "item": Variants("input[].type", {
        **{kind: works("see its keys") for kind in ("message", "function_call",
                                                     "function_call_output", "reasoning")},
        "item_reference": refused(f"item references are not supported: {STATELESS}"),
        **{kind: HOSTED_ITEM for kind in (
            "file_search_call", "computer_call", "computer_call_output", "web_search_call",
            "tool_search_call", "tool_search_output", "image_generation_call",
            "code_interpreter_call", "local_shell_call", "local_shell_call_output",
            "shell_call", "shell_call_output", "apply_patch_call", "apply_patch_call_output",
            "mcp_list_tools", "mcp_approval_request", "mcp_approval_response", "mcp_call",
            "custom_tool_call", "custom_tool_call_output", "program", "program_output",
            "additional_tools", "configuration_update")},
        **{kind: inert("OpenAI's encrypted summary of earlier turns: nothing a local model "
                       "can read") for kind in ("compaction", "compaction_trigger")},
    }),
    "part": Variants("input[].content[].type", {
        "input_text": works("text"), "output_text": works("text"),
        "input_image": works(PICTURES),
        **{kind: refused(OTHER_MEDIA) for kind in ("input_file", "input_audio")},
        "refusal": refused("a refusal cannot be replayed to a local model; send its text"),
    }),
    "output_part": Variants("input[].output[].type", {
        "input_text": works("text"), "output_text": works("text"),
        "input_image": refused("a tool result's pictures are not supported: show them in a "
                               "user message"),
        **{kind: refused(OTHER_MEDIA) for kind in ("input_file", "input_audio")},
    }),
    "tool": Variants("tools[].type", {
        "function": works("a function the client runs"),
        "namespace": works("functions grouped under a name (Codex's)"),
        **{kind: HOSTED_TOOL for kind in (
            "file_search", "computer", "computer_use*", "web_search*", "mcp",
            "code_interpreter", "programmatic_tool_calling", "image_generation", "local_shell",
            "shell", "tool_search", "apply_patch", "custom")},
    }),
    "nested": Variants("tools[].tools[].type", {"function": works("a function")}),
    "include": Variants("include[]", {
        "reasoning.encrypted_content": works("reasoning items carry `encrypted_content`"),
        "message.output_text.logprobs": refused("logprobs are not returned here (chat "
                                                "completions has them)"),
        **{kind: inert("data of tools exod does not run") for kind in (
            "file_search_call.results", "web_search_call.results",
            "web_search_call.action.sources", "message.input_image.image_url",
            "computer_call_output.output.image_url", "code_interpreter_call.outputs")},
    }),
})
