"""The rules a generation request must pass: one copy of each, for the daemon and the runner.
One module per topic (base, generation, messages, tools; embeddings and rerank inputs), all of
it importable from here (`rules.max_tokens`, `rules.RequestError`). The daemon checks every
field of a request body here (exod.api.request turns a RequestError into an HTTP 400 naming the
field); the runner checks again here, with the numbers of the model as loaded, whatever sent
the request (exod.runner.serving.prepare: nothing reaches mlx unchecked). Pure logic.

How a rule is written, so that it is written once:
- one small function named after its field: the raw value (and the model's numbers it needs)
  in, the checked value out, or `RequestError(message, param)`, its message written there and
  nowhere else ("`field` must be ...", in one line); a number with a default and a range is a
  row of `NUMBERS` instead (`number(name, raw)`); a limit is a constant of its module (MAX_...);
- wired once: exod.api.request calls it for the endpoints that take the field, and
  exod.runner.serving.prepare calls the same function when the runner must check it again
  before mlx; tests/unit/test_request_rules.py gets a test that fails when the rule is dropped.
"""

from __future__ import annotations

from exod.core.request_rules.base import (  # noqa: F401
    MAX_SCHEMA_DEPTH, RequestError, text, name, depth, plain, text_field, flag, integer, obj, array,
    one_of, required,
)
from exod.core.request_rules.generation import (  # noqa: F401
    DEFAULT_MAX_TOKENS_CHAT, DEFAULT_MAX_TOKENS_COMPLETION, MAX_STOPS, MAX_STOP_CHARS,
    MAX_BIAS, BIAS_LIMIT, MAX_TOP_K, MAX_REPETITION_PENALTY, MAX_CONTEXT_SIZE,
    DEFAULT_CONTEXT_SIZE, CONTEXT_SIZES, MAX_TOP_LOGPROBS, MAX_TEMPLATE_KWARGS,
    MAX_TEMPLATE_KWARGS_CHARS, MAX_THINK_BUDGET, RESERVED_TEMPLATE_KWARGS, Range, NUMBERS,
    number, body, model, seed, stream, stream_options, stop, max_tokens, max_tokens_cap,
    think_budget, below, fit_window, MODEL_WINDOW, WindowExceeded, logit_bias,
    bias_ids, top_k, repetition_penalty, context_size, context_window, logprobs, top_logprobs,
    completion_logprobs, chat_template_kwargs,
)
from exod.core.request_rules.messages import (  # noqa: F401
    ROLES, MESSAGE_KEYS, CALL_KEYS, messages, message, content, prompt, prompt_ids, turn,
    reasoning, past_calls, past_call, call,
)
from exod.core.request_rules.tools import (  # noqa: F401
    MAX_TOOLS, MAX_SCHEMA_BYTES, TOOL_CHOICES, FUNCTION_KEYS, schema, tools, tool, function,
    unique, strict_tools, for_template, tool_choice, choice, named, response_format,
    json_output, schema_bytes,
)
from exod.core.request_rules import embeddings as embeddings  # noqa: F401, E402
