"""Every field a request body may hold, and what exod does with it: nothing is accepted and
ignored. A field exod serves is checked and used (exod.api.schema); a field it cannot serve is
refused by name (HTTP 400) unless it holds its no-op value; a field that cannot change the
answer (who the user is, billing, OpenAI's own storage and caching hints) is accepted and has no
effect, and is listed as such in the README. Any other field is refused by name: a typo or a
server-specific option must never go unnoticed.

The tables follow the newest `openai` client's request types (tests/unit/test_fields.py checks
that every field of them is here).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from exod.core.request_rules import RequestError

# Fields read and checked by exod.api.schema, per endpoint (OpenAI's and the common extensions
# of local servers: vLLM's and mlx_lm.server's names).
SAMPLING = ("temperature", "top_p", "top_k", "min_p", "seed", "logit_bias", "stop",
            "repetition_penalty", "repetition_context_size", "presence_penalty",
            "presence_context_size", "frequency_penalty", "frequency_context_size",
            "max_tokens", "n", "stream", "stream_options", "model")
SERVED: Mapping[str, frozenset[str]] = {
    "chat": frozenset((*SAMPLING, "messages", "max_completion_tokens", "logprobs",
                       "top_logprobs", "chat_template_kwargs", "tools", "tool_choice",
                       "parallel_tool_calls", "response_format")),
    "completion": frozenset((*SAMPLING, "prompt", "logprobs", "echo")),
}

# Accepted with no effect: none of them can change the answer.
NO_EFFECT: Mapping[str, frozenset[str]] = {
    "chat": frozenset(("user", "metadata", "store", "safety_identifier", "service_tier",
                       "prompt_cache_key", "prompt_cache_retention", "prompt_cache_options",
                       "prediction")),
    "completion": frozenset(("user",)),
}


def _null(v: Any) -> bool:
    return v is None


def _text_only(v: Any) -> bool:
    return v is None or v == ["text"]


def _one(v: Any) -> bool:
    return v is None or (type(v) is int and v == 1)


def _empty(v: Any) -> bool:
    return v is None or v == ""


# Not served: refused by name unless the value asks for nothing (the check returns True).
Check = Callable[[Any], bool]
REFUSED: Mapping[str, Mapping[str, tuple[Check, str]]] = {
    "chat": {
        "audio": (_null, "audio output is not supported"),
        "modalities": (_text_only, "only [\"text\"] is supported"),
        "functions": (_null, "the deprecated `functions` are not supported"),
        "function_call": (_null, "the deprecated `function_call` is not supported"),
        "moderation": (_null, "moderation is not supported"),
        "reasoning_effort": (_null, "it is not supported; a model whose chat template takes "
                                    "it gets it through `chat_template_kwargs`"),
        "verbosity": (_null, "it is not supported"),
        "web_search_options": (_null, "web search is not supported"),
    },
    "completion": {
        "best_of": (_one, "it must be 1: exod returns one choice"),
        "suffix": (_empty, "it is not supported"),
    },
}


def check_fields(body: Mapping[str, Any], endpoint: str) -> None:
    """RequestError (a 400) naming the first field exod does not serve (see the module)."""
    served, quiet, refused = SERVED[endpoint], NO_EFFECT[endpoint], REFUSED[endpoint]
    for name, value in body.items():
        if name in served or name in quiet:
            continue
        rule = refused.get(name)
        if rule is None:
            raise RequestError(f"`{name}` is not a field exod knows (see the README's table "
                               "of request fields)", name)
        ok, why = rule
        if not ok(value):
            raise RequestError(f"`{name}`: {why}", name)


def known(endpoint: str) -> frozenset[str]:
    """Every field the endpoint takes one way or another."""
    return SERVED[endpoint] | NO_EFFECT[endpoint] | frozenset(REFUSED[endpoint])
