"""OpenAI chat completions (`POST /v1/chat/completions`) and completions (`POST
/v1/completions`): what exod does with each field (the rules they pass are
exod.core.request_rules; the mapping is exod.api.request)."""

from __future__ import annotations

from typing import Any

from exod.api.fields import Dialect, Field, Obj, Variants, empty, inert, null, refused, works
from exod.core import request_rules as rules


def _one(value: Any) -> bool:
    return value is None or (type(value) is int and value == 1)


def _text_only(value: Any) -> bool:
    return value is None or value == ["text"]


def _not_set(value: Any) -> bool:
    return value is None or value is False


OTHER_MEDIA = "exod's models take text and pictures only"
PICTURES = ("a picture, for a model that sees (a model that does not: 400 naming the part): "
            "its bytes in a base64 `data:` URL, or an http(s) URL that exod fetches (see "
            "docs/vision.md; `api.image_urls`)")
# The sampling set and what comes back beside the text: the same in both endpoints.
SAMPLING: dict[str, Field] = {
    "model": works("the instance that answers"),
    "temperature": works("0 to 2, default 1; 0 (or too small to divide by in float32) is "
                         "greedy"),
    "top_p": works("0 to 1, default 1; 0 keeps only the most probable token"),
    "top_k": works("the k most probable tokens; 0 or -1: off (mlx-lm's `apply_top_k`)"),
    "min_p": works("0 to 1; 0: off (mlx-lm's `apply_min_p`)"),
    # vLLM's and llama.cpp's: benchmark clients send it to force lengths. exod ends an answer
    # where the model does, so it would change the answer: refused rather than ignored.
    "ignore_eos": refused("it is not supported: an answer ends where the model ends it",
                          _not_set, "refused unless false"),
    "repetition_penalty": works(f"more than 0, at most {rules.MAX_REPETITION_PENALTY:g} (1: "
                                "off), over the last `repetition_context_size` tokens"),
    "presence_penalty": works("-2 to 2, mlx-lm's processor, over the last "
                              "`presence_context_size` tokens"),
    "frequency_penalty": works("-2 to 2, mlx-lm's processor, over the last "
                               "`frequency_context_size` tokens"),
    **{name: works(f"tokens a penalty looks back on (default {rules.DEFAULT_CONTEXT_SIZE}, "
                   "the prompt included, as mlx-lm)") for name in rules.CONTEXT_SIZES},
    "seed": works("reproduces the answer, whatever runs beside it"),
    "logit_bias": works(f"token ids inside the vocabulary, -{rules.BIAS_LIMIT} to "
                        f"{rules.BIAS_LIMIT}, at most {rules.MAX_BIAS}"),
    "stop": works(f"a string or up to {rules.MAX_STOPS}; never matched in the reasoning"),
    "n": refused("it must be 1: exod returns one choice", _one, "must be 1"),
    "stream": works("Server-Sent Events"),
    "stream_options": works("`include_usage`: a last chunk with the usage"),
}

MAX_TOKENS = ("the most tokens to generate (default {}); a larger value than the model's "
              "context window leaves, or than the instance's `max_tokens_cap`, is clamped to "
              "it (the answer then ends with finish reason `length`)")

CHAT = Dialect("chat", "POST /v1/chat/completions", intro=(
    "A message's text is a string or an array of text parts. Tools, `tool_choice` and "
    "`response_format` are described in [tools.md](tools.md)."), objects={
    "body": Obj("", {
        **SAMPLING,
        "messages": works("the conversation, into the model's chat template"),
        "max_tokens": works(MAX_TOKENS.format(rules.DEFAULT_MAX_TOKENS_CHAT)),
        "max_completion_tokens": works("as `max_tokens`; the newer name wins"),
        "logprobs": works("`choices[].logprobs.content[]` with `token`, `logprob`, `bytes`, "
                          "`top_logprobs`, streamed too"),
        "top_logprobs": works(f"0 to {rules.MAX_TOP_LOGPROBS}, with `logprobs: true`"),
        "chat_template_kwargs": works("variables for the chat template (`enable_thinking`...), "
                                      "over the instance's own `chat_template_kwargs`"),
        "tools": works(f"function tools (at most {rules.MAX_TOOLS}), passed to the model's own "
                       "chat template"),
        "tool_choice": works("`none`, `auto`, `required` or a named function: forced by a "
                             "grammar"),
        "parallel_tool_calls": works("`false`: the generation ends after the first call"),
        "response_format": works("`text`, `json_object` or `json_schema`: enforced by a "
                                 "grammar"),
        **{name: inert(why) for name, why in (
            ("user", "who the user is"), ("metadata", "a caller's own labels"),
            ("store", "OpenAI's storage; exod keeps nothing"),
            ("safety_identifier", "who the user is"), ("service_tier", "billing"),
            ("prompt_cache_key", "a caching hint: exod's prompt cache is automatic"),
            ("prompt_cache_retention", "a caching hint"), ("prompt_cache_options",
                                                            "a caching hint"),
            ("prediction", "a predicted output only speeds OpenAI up"))},
        "audio": refused("audio output is not supported", null, "refused unless null"),
        "modalities": refused('only ["text"] is supported', _text_only, 'only `["text"]`'),
        "functions": refused("the deprecated `functions` are not supported; send `tools`",
                             null, "refused unless null (send `tools`)"),
        "function_call": refused("the deprecated `function_call` is not supported; send "
                                 "`tool_choice`", null, "refused unless null"),
        "moderation": refused("moderation is not supported", null, "refused unless null"),
        "reasoning_effort": refused("it is not supported; a model whose chat template takes "
                                    "it gets it through `chat_template_kwargs`", null,
                                    "refused unless null (a template that takes it gets it "
                                    "through `chat_template_kwargs`)"),
        "verbosity": refused("it is not supported", null, "refused unless null"),
        "web_search_options": refused("web search is not supported", null,
                                      "refused unless null"),
    }),
    "message": Obj("messages[]", {
        "role": works("`system`, `developer` (as `system`), `user`, `assistant`, `tool`"),
        "content": works("a string, or an array of text and `image_url` parts"),
        "name": works("reaches the template"),
        "tool_calls": works("an assistant's calls, kept in the turn the template receives "
                            "(arguments as an object)"),
        "tool_call_id": works("a tool message's call"),
        "reasoning_content": works("an assistant's thinking, under that key, which Qwen3's "
                                   "and DeepSeek's templates read"),
        **{key: refused(why, empty, "only empty (an answer sent back as it came)")
           for key, why in (
            ("refusal", "a refusal cannot be replayed to a local model; send its text as "
                        "`content`"),
            ("annotations", "annotations (OpenAI's citations) are not supported"),
            ("audio", "audio is not supported"),
            ("function_call", "the deprecated `function_call` is not supported; send "
                              "`tool_calls`"))},
    }),
    "part": Obj("messages[].content[]", {
        "type": works("`text`"), "text": works("joined into the message's text"),
        "cache_control": inert("a caching hint (exod's prompt cache needs none)"),
    }, "a text part"),
    "image_part": Obj("messages[].content[]", {
        "type": works("`image_url`"),
        "image_url": works("`{url, detail}`, or the URL alone"),
        "cache_control": inert("a caching hint (exod's prompt cache needs none)"),
    }, "an `image_url` part"),
    "image_url": Obj("messages[].content[].image_url", {
        "url": works("a `data:` URL (base64) or an http(s) URL"),
        "detail": inert("the model's processor sizes the picture as it was trained to"),
    }),
    "call": Obj("messages[].tool_calls[]", {
        "id": works("the call's id, which a tool message names"), "type": works("`function`"),
        "function": works("`name`, `arguments` (JSON text or an object)"),
        "index": inert("a streamed call's place"),
    }),
    "call.function": Obj("messages[].tool_calls[].function", {
        "name": works("the function called"), "arguments": works("a JSON object, as text or "
                                                                 "as is"),
    }),
    "tool": Obj("tools[]", {"type": works("`function`"), "function": works("the function")}),
    "function": Obj("tools[].function", {
        "name": works("1 to 64 letters, digits, `_`, `.` or `-`"),
        "description": works("reaches the template"),
        "parameters": works("a JSON schema: reaches the template; followed by forced calls"),
        "strict": works("`true`: the parameters must be enforceable whole, and a call must "
                        "follow them"),
    }),
    "tool_choice": Obj("tool_choice", {"type": works("`function`"),
                                       "function": works("`{name}`: the tool to call")}),
    "tool_choice.function": Obj("tool_choice.function", {"name": works("a tool in `tools`")}),
    "response_format": Obj("response_format", {
        "type": works("`text`, `json_object` or `json_schema`"),
        "json_schema": works("`name`, `schema`, `strict`")}),
    "json_schema": Obj("response_format.json_schema", {
        "name": works("1 to 64 letters, digits, `_`, `.` or `-`"),
        "schema": works("the JSON schema the output follows"),
        "strict": works("`true`: a keyword the engine does not implement is refused naming "
                        "it; otherwise it is left out"),
        "description": inert("no template takes it")}),
    "stream_options": Obj("stream_options", {
        "include_usage": works("a last chunk with `choices: []` and the usage"),
        "include_obfuscation": inert("exod's chunks carry no padding")}),
}, variants={
    "part": Variants("messages[].content[].type", {
        "text": works("text"),
        "image_url": works(PICTURES),
        **{kind: refused(OTHER_MEDIA) for kind in ("input_audio", "file")},
        "refusal": refused("a refusal cannot be replayed to a local model; send its text"),
    }),
    "tool": Variants("tools[].type", {
        "function": works("a function tool"),
        "custom": refused("custom (free-form) tools are not supported; define a function"),
    }),
})

COMPLETION = Dialect("completion", "POST /v1/completions", objects={
    "body": Obj("", {
        **SAMPLING,
        "prompt": works("one string (or an array of one)"),
        "max_tokens": works(MAX_TOKENS.format(rules.DEFAULT_MAX_TOKENS_COMPLETION)),
        "logprobs": works(f"0 to {rules.MAX_TOP_LOGPROBS}: the legacy `tokens`, "
                          "`token_logprobs`, `top_logprobs`, `text_offset`"),
        "echo": refused("it is not supported", _not_set, "refused unless false"),
        "best_of": refused("it must be 1: exod returns one choice", _one, "must be 1"),
        "suffix": refused("it is not supported", empty, "refused unless empty"),
        "user": inert("who the user is"),
    }),
    "stream_options": CHAT.objects["stream_options"],
})
