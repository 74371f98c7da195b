"""Ollama's API (`POST /api/chat`, `/api/generate`, and the management endpoints' bodies): what
exod does with each field (the mapping is exod.api.dialects.ollama.request and
exod.api.dialects.ollama.manage)."""

from __future__ import annotations

from typing import Any

from exod.api.fields import (Dialect, Field, Obj, Variants, empty, false, inert, null,
                             refused, works)
from exod.api.dialects.embeddings.fields import MODEL
from exod.core import request_rules as rules
from exod.core.request_rules import embeddings as embed_rules


def _off(off: float) -> Any:
    """A sampler's value that leaves it off (or none at all) passes."""
    return lambda value: value is None or (not isinstance(value, bool) and value == off)


INSTANCE = "set by the instance's config (exod.yaml), not per request"
IMAGES = ("pictures in base64 (JPEG, PNG, WebP, GIF; 16 a request), before the turn's text, for "
          "a model that sees (the vision runner; `vision` in /api/show's capabilities); a text "
          "model refuses them by name")
# The body fields both endpoints share.
_COMMON: dict[str, Field] = {
    "model": works("the instance that answers: its name or an alias, with or without a tag "
                   "(`:latest`)"),
    "stream": works("NDJSON, one object a line (default `true`); `false`: one object"),
    "format": works("`\"json\"`, or a JSON schema the answer follows: enforced by a grammar"),
    "options": works("sampling and length (below)"),
    "keep_alive": works("the idle window of an on-demand instance once the request ends: a "
                        "duration (`5m`), seconds, `0` (stop once no request is in flight) or "
                        "`-1` (keep), within the instance's `keep_alive: {min, max}`; no effect "
                        "on an instance that is always on"),
    "think": works("`true`/`false`: the template's `enable_thinking`; `\"high\"`, "
                   "`\"medium\"`: on, `\"low\"`: off (a local template has one switch); the "
                   "thinking comes back apart, in `thinking`"),
    "logprobs": works("each token's `logprobs` (`token`, `logprob`, `bytes`, "
                      "`top_logprobs`), streamed too"),
    "top_logprobs": works(f"0 to {rules.MAX_TOP_LOGPROBS}, with `logprobs: true`"),
}
UNBOUNDED = "-1 (or unset) and -2: as many as the context leaves, as Ollama"

OLLAMA_CHAT = Dialect("ollama_chat", "POST /api/chat", intro=(
    "Ollama's chat: the same generation as chat completions', its answer as Ollama's NDJSON "
    "(`message`, then a last object with `done: true`, `done_reason` and the statistics in "
    "nanoseconds). A body with no `messages` (or an empty list) loads the model, or with "
    "`keep_alive: 0` stops it, and answers at once (`done_reason` `load` or `unload`)."),
    objects={
    "body": Obj("", {
        **_COMMON,
        "messages": works("the conversation: `system`, `user`, `assistant`, `tool` turns"),
        "tools": works(f"function tools (at most {rules.MAX_TOOLS}), into the model's own chat "
                       "template; calls come back in `message.tool_calls` with `arguments` as "
                       "an object"),
    }),
    "message": Obj("messages[]", {
        "role": works("`system`, `user`, `assistant` or `tool`"),
        "content": works("the turn's text"),
        "thinking": works("an assistant's thinking, as `reasoning_content`, which Qwen3's and "
                          "DeepSeek's templates read"),
        "tool_calls": works("an assistant's calls (arguments as an object, or JSON text)"),
        "tool_name": works("a tool turn's tool, which reaches the template (as `name`)"),
        "tool_call_id": works("a tool turn's call"),
        "images": works(IMAGES),
    }),
    "call": Obj("messages[].tool_calls[]", {
        "function": works("`name` and `arguments`"), "id": works("the call's id"),
        "type": inert("`function`, the only kind"),
    }),
    "call.function": Obj("messages[].tool_calls[].function", {
        "name": works("the function called"),
        "arguments": works("an object (or its JSON text)"),
        "index": inert("the call's place among the turn's calls"),
    }),
    "tool": Obj("tools[]", {"type": works("`function`"), "function": works("the function")}),
    "function": Obj("tools[].function", {
        "name": works("1 to 64 letters, digits, `_`, `.` or `-`"),
        "description": works("reaches the template"),
        "parameters": works("a JSON schema: reaches the template"),
    }),
    "options": Obj("options", {
        "num_predict": works(f"the most tokens to generate; {UNBOUNDED}; within the instance's "
                             "`max_tokens_cap`"),
        "num_ctx": works("this request's context window, within the model's: a prompt that "
                         "fills it is refused by name, a generation that would pass it ends "
                         "there (`done_reason: length`)"),
        "temperature": works("0 to 2 (default 1, as every dialect of exod); 0 is greedy"),
        "top_p": works("0 to 1"), "top_k": works("the k most probable tokens; 0: off"),
        "min_p": works("0 to 1; 0: off"), "seed": works("reproduces the answer"),
        "stop": works(f"up to {rules.MAX_STOPS} strings; never matched in the thinking"),
        "repeat_penalty": works(f"more than 0, at most {rules.MAX_REPETITION_PENALTY:g} (1: "
                                "off): mlx-lm's repetition penalty"),
        "presence_penalty": works("-2 to 2"), "frequency_penalty": works("-2 to 2"),
        "repeat_last_n": works("tokens the three penalties look back on (default "
                               f"{rules.DEFAULT_CONTEXT_SIZE}); 0: the penalties off; -1: all"),
        "mirostat": refused("mirostat sampling is not available (mlx-lm has no such sampler)",
                            _off(0), "refused unless 0 (off)"),
        "tfs_z": refused("tail-free sampling is not available (mlx-lm has no such sampler)",
                         _off(1), "refused unless 1 (off)"),
        "typical_p": refused("typical sampling is not available (mlx-lm has no such sampler)",
                             _off(1), "refused unless 1 (off)"),
        "mirostat_tau": inert("used by mirostat alone"),
        "mirostat_eta": inert("used by mirostat alone"),
        "penalize_newline": inert("Ollama itself no longer applies it"),
        "num_keep": inert("what stays when a full context shifts: exod never shifts it (a "
                          "prompt that fills the window is refused)"),
        **{name: inert(INSTANCE) for name in (
            "numa", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "logits_all",
            "vocab_only", "use_mmap", "use_mlock", "embedding_only", "num_thread")},
    }, "`options` (both endpoints)"),
    }, variants={"tool": Variants("tools[].type", {"function": works("a function tool")})})

OLLAMA_GENERATE = Dialect("ollama_generate", "POST /api/generate", intro=(
    "Ollama's completion of a prompt: through the model's chat template as one user turn, "
    "unless `raw`. `options` as `/api/chat`'s. A body with no `prompt` (or an empty one) loads "
    "the model, or with `keep_alive: 0` stops it, and answers at once."), objects={
    "body": Obj("", {
        **_COMMON,
        "prompt": works("the user's turn (or with `raw`, the whole prompt)"),
        "system": works("a system turn before it (instead of none: exod keeps no Modelfile)"),
        "template": works("a Go template of `{{ .System }}` and `{{ .Prompt }}` (and "
                          "`{{ .Suffix }}`) in place of the model's chat template; other "
                          "actions are refused by name"),
        "raw": works("`true`: the prompt as it is, no template"),
        "suffix": works("fill in the middle: the text after the answer, for a model with "
                        "fill-in-the-middle tokens (`insert` in /api/show's capabilities); "
                        "refused by name for others"),
        "images": works(IMAGES + "; not with `raw`, `template` or `suffix`"),
        "context": refused("exod keeps no token context between requests: send the "
                           "conversation to /api/chat", empty, "only empty"),
        **{name: refused("image generation models are not served", null,
                         "refused unless null") for name in ("width", "height", "steps")},
    }),
    "options": OLLAMA_CHAT.objects["options"],
})

OLLAMA_MANAGE = Dialect("ollama", "POST /api/show, /api/pull, DELETE /api/delete", objects={
    "show": Obj("", {"model": works("an instance's name or alias"),
                     "name": works("as `model` (older clients)"),
                     "verbose": inert("the tokenizer's lists are not shown")}, "/api/show"),
    "pull": Obj("", {
        "model": works("a hub repository (`ORG/NAME`, `hf.co/ORG/NAME[:REVISION]`, "
                       "`hf:ORG/NAME[@REVISION]`), or an instance (its hub model)"),
        "name": works("as `model` (older clients)"),
        "stream": works("NDJSON status lines (default `true`)"),
        "insecure": refused("exod fetches over the hub's own connection", false,
                            "refused unless false")}, "/api/pull"),
    "delete": Obj("", {"model": works("a hub repository, or an instance (its hub model)"),
                       "name": works("as `model` (older clients)")}, "/api/delete"),
})

OLLAMA_OPTIONS = inert("Ollama's model options (sampling, `num_ctx`, threads...) do not change "
                       "an encoder's vectors here: an input is cut at the model's own length "
                       "(`truncate`)")
OLLAMA_KEEP_ALIVE = works("the idle window of an on-demand instance once the request ends, as "
                          "for /api/chat: a duration (`5m`), seconds, `0` or `-1`, within the "
                          "instance's `keep_alive: {min, max}`")

OLLAMA_EMBED = Dialect("ollama_embed", "POST /api/embed", intro=(
    "Ollama's embeddings endpoint, served as `/v1/embeddings` is (docs/embeddings.md). The "
    "answer: `{model, embeddings, total_duration, load_duration, prompt_eval_count}`, each "
    "vector of length 1 (as Ollama gives them, whatever the model's own normalization)."),
    objects={"body": Obj("", {
        "model": MODEL,
        "input": works(f"a string or an array of strings (at most {embed_rules.MAX_INPUTS})"),
        "truncate": works("an input longer than the model takes: `true` (default) cuts it to "
                          "the model's length, `false` refuses it (naming it)"),
        "dimensions": works("vectors cut to this size, then normalized again: only for a model "
                            "trained for it, else refused by name"),
        "options": OLLAMA_OPTIONS,
        "keep_alive": OLLAMA_KEEP_ALIVE,
    })})

OLLAMA_EMBEDDINGS = Dialect("ollama_embeddings", "POST /api/embeddings", intro=(
    "Ollama's older embeddings endpoint: one `prompt`, answered `{embedding}`, the vector as "
    "the model's own files say (normalized or not), as Ollama gives it."), objects={
    "body": Obj("", {
        "model": MODEL,
        "prompt": works("the text (cut to the model's length when longer)"),
        "options": OLLAMA_OPTIONS,
        "keep_alive": OLLAMA_KEEP_ALIVE,
    })})
