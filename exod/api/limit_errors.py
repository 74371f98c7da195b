"""A key's limit reached (exod.core.usage.gate.Limited), as clients already handle it: 429 with
`Retry-After` and OpenAI's `x-ratelimit-*` headers (Anthropic's `anthropic-ratelimit-*` too);
a quota used up also says `x-should-retry: false`, so the official clients do not wait hours
for it (they would sleep whatever `Retry-After` says), and Anthropic's Messages answer it with
529 (exod.api.dialects.anthropic.request.error_status)."""

from __future__ import annotations

import math

from exod.api.errors import ApiError
from exod.core.durations import format_duration
from exod.core.usage.calendar import iso
from exod.core.usage.gate import Kind, Limited, TokenWindow

QUOTA_CODE = "insufficient_quota"  # OpenAI's code for a quota used up
RATE_CODE = "rate_limit_exceeded"
ANTHROPIC_KIND: dict[Kind, str] = {"prompt": "input", "completion": "output"}
WORDS = {"prompt_tokens_per_minute": "prompt tokens per minute",
         "completion_tokens_per_minute": "completion tokens per minute"}


def limited(e: Limited, wall: float) -> ApiError:
    """The answer to a request refused by its key's limit `e`, at `wall` (epoch seconds)."""
    retry = max(1, math.ceil(e.retry_after))
    headers = {"Retry-After": str(retry), **token_headers(e.tokens, e.what, wall)}
    if e.resets_at is not None:  # a quota: until the next UTC day or month
        period = "day" if e.what == "tokens_per_day" else "month"
        headers.update({"x-should-retry": "false", "x-exod-quota-reset": iso(e.resets_at)})
        return ApiError(429, f"The key `{e.key}` has used its quota of {e.limit} tokens per "
                             f"{period} (UTC calendar, prompt and completion): it resets at "
                             f"{iso(e.resets_at)}, in {format_duration(retry)}.",
                        QUOTA_CODE, QUOTA_CODE, headers=headers)
    if e.what == "in_flight":
        return ApiError(429, f"The key `{e.key}` has {e.limit} request(s) in flight, the most "
                             "it may: retry once one has ended.", "requests", RATE_CODE,
                        headers=headers)
    return ApiError(429, f"The key `{e.key}` is over its limit of {e.limit} "
                         f"{WORDS.get(e.what, e.what)}: retry in {retry}s.", "tokens",
                    RATE_CODE, headers=headers)


def token_headers(tokens: dict[Kind, TokenWindow], what: str, wall: float) -> dict[str, str]:
    """OpenAI's `x-ratelimit-*-tokens` for the bucket that refused (else the prompt's), and
    Anthropic's input and output token headers for each bucket the key has."""
    out: dict[str, str] = {}
    kind: Kind = "completion" if what.startswith("completion") else "prompt"
    main = tokens.get(kind) or next(iter(tokens.values()), None)
    if main is not None:
        out.update({"x-ratelimit-limit-tokens": str(main.limit),
                    "x-ratelimit-remaining-tokens": str(main.remaining),
                    "x-ratelimit-reset-tokens": go_duration(main.reset_after)})
    for k, w in tokens.items():
        name = f"anthropic-ratelimit-{ANTHROPIC_KIND[k]}-tokens"
        out.update({f"{name}-limit": str(w.limit), f"{name}-remaining": str(w.remaining),
                    f"{name}-reset": iso(math.ceil(wall + w.reset_after))})
    return out


def go_duration(seconds: float) -> str:
    """OpenAI's way of writing a reset: `1s`, `6m0s`, `250ms`, `1h2m3s`."""
    ms = max(0, math.ceil(seconds * 1000))
    if ms < 1000:
        return f"{ms}ms"
    s = math.ceil(ms / 1000)
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    if h:
        return f"{h}h{m}m{s}s"
    return f"{m}m{s}s" if m else f"{s}s"
