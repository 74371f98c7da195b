"""One generation request in the runner, read from its `generate` message: prompt tokens (chat
template or raw text), a sampler of its own (exod.runner.serving.sampling), logits processors
(logit bias, penalties, a grammar or a thinking budget), stop sequences, and what it shows
(exod.runner.serving.output: think markers, logprobs). Every field is checked again here by
the request rules (exod.core.request_rules), with the numbers of the model as loaded
(exod.runner.serving.model_checks), whatever sent it: nothing reaches mlx unchecked.

The engine (exod.runner.serving.batch_engine.BatchEngine, on every rank of a group too) builds its
requests from here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from exod.wire import messages as m
from exod.core import context_edits, images, request_rules as rules
from exod.core.request_rules import RequestError
from exod.runner import formats
from exod.runner.serving import model_checks, tool_calls
from exod.runner.serving.grammar import Constraint, Grammars
from exod.runner.serving.think_budget import ThinkBudget
from exod.runner.serving.think_grammar import Thinking
from exod.runner.serving.output import Markers, opens_thinking, think_markers
from exod.runner.serving.reading import Prompt
from exod.runner.serving.sampling import make_request_sampler, penalty_processors, stateless
from exod.runner.serving.strict_args import ArgsCheck

__all__ = ["Checked", "read_prompt", "check_request", "prompt_tokens",
           "bias_processors", "context_window", "make_request_sampler", "vocab_size"]

context_window = model_checks.context_window

Sampler = Callable[[mx.array], mx.array]
Processor = Callable[[mx.array, mx.array], mx.array]


def chat_prompt(tokenizer: Any, messages: list[dict[str, Any]],
                tools: list[dict[str, Any]] | None = None,
                template_kwargs: dict[str, Any] | None = None,
                answer: bool = True) -> list[int]:
    """The turns' tokens, then the assistant's turn to answer in; without it (`answer`
    False: a `warm:` prompt), the turns as a later request starts with them."""
    if getattr(tokenizer, "has_chat_template", True):
        extra = rules.chat_template_kwargs(template_kwargs or None)
        fmt = formats.format_of(tokenizer)
        if fmt is not None:  # ids, reasoning and calls as the model's template takes them
            messages = fmt.messages(messages)
        # The tools go to the model's own template, which knows how the model wants them.
        try:
            tokens = tokenizer.apply_chat_template(messages, tools=tools or None,
                                                   add_generation_prompt=answer, **extra)
        except Exception:
            # Many templates take a system turn only first (Qwen's raise on one elsewhere),
            # where agents put theirs anywhere: such turns join the leading one.
            first = context_edits.system_first(messages)
            if first is messages:
                raise
            tokens = tokenizer.apply_chat_template(first, tools=tools or None,
                                                   add_generation_prompt=answer, **extra)
        return [int(t) for t in tokens]
    # No template in the model: plain "role: content" lines, then the assistant's turn.
    text = "".join(f"{msg['role']}: {msg['content']}\n" for msg in messages)
    return list(tokenizer.encode(text + ("assistant: " if answer else "")))


def prompt_tokens(tokenizer: Any, req: m.Generate) -> list[int]:
    return edited_prompt(tokenizer, req)[0]


def edited_prompt(tokenizer: Any, req: m.Generate) -> tuple[list[int], list[dict[str, Any]]]:
    """The prompt's tokens, after the request's context edits, and the edits that applied."""
    if req.images:  # only the vision runner (exod.runner.vision) takes them
        where = req.named(images.first_image_part(req.messages or []) or "messages")
        raise RequestError(images.unseen(None, where), where)
    applied: list[dict[str, Any]] = []
    if req.kind == "chat":
        first = req.messages or []
        # The prompts of the conversation as sent and of the latest edit tried, made once: the
        # edits count them, and the prompt is one of them (two kept, not every edit's).
        kept: dict[bool, tuple[list[dict[str, Any]], list[int]]] = {}

        def render(messages: list[dict[str, Any]]) -> list[int]:
            for known, made in kept.values():
                if known is messages:
                    return made
            made = chat_prompt(tokenizer, messages, req.tools, req.chat_template_kwargs)
            kept[messages is first] = (messages, made)
            return made
        try:
            messages, applied = context_edits.apply(first, req.context_edits,
                                                    lambda msgs: len(render(msgs)))
            tokens = render(messages)
        except RequestError:
            raise
        except Exception as e:  # noqa: BLE001 -- e.g. a chat template that rejects the roles
            raise RequestError(f"{type(e).__name__}: {e}", req.named("messages")) from e
    else:
        text = req.prompt or ""
        # BOS as the model wants it, unless the text already starts with it (as mlx-lm does).
        bos = getattr(tokenizer, "bos_token", None)
        tokens = list(tokenizer.encode(text, add_special_tokens=bos is None
                                       or not text.startswith(bos))) if text else []
    return [int(t) for t in tokens], applied


def prompt_param(req: m.Generate) -> str:
    return req.named("messages") if req.kind == "chat" else "prompt"


@dataclass(frozen=True)
class Checked:
    """A request as an engine takes it: its prompt, and every number checked for the model."""

    prompt: list[int]
    max_tokens: int
    processors: list[Processor]
    sampler: Sampler
    top_logprobs: int | None = None  # None: no logprobs; else how many top tokens with each
    markers: Markers | None = None  # the think markers, for a chat
    thinking: bool = False  # the prompt ends inside a think block
    args_check: ArgsCheck | None = None  # its strict tools, whose calls are checked
    grammar: Constraint | None = None  # for the batch's sampler (batched): not a processor


def read_prompt(tokenizer: Any, req: m.Generate, vocab: int, window: int | None,
                grammars: Grammars | None = None, tokens: list[int] | None = None) -> Prompt:
    """The long part of taking a request (chat template, tokenizer, a check per token: seconds
    for megabytes; its grammar compiled), in Python, the tokenizer and the grammar engine: safe
    off the thread that runs mlx. `tokens`: its prompt, when made elsewhere (a model that sees:
    exod.runner.vision.prompt)."""
    fmt = formats.format_of(tokenizer)
    tool_calls.check(fmt, req)
    prompt, applied = edited_prompt(tokenizer, req) if tokens is None else (tokens, [])
    rules.prompt_ids(prompt, vocab, prompt_param(req))
    max_tokens = rules.fit_window(len(prompt), rules.max_tokens(req.max_tokens), window,
                                  prompt_param(req))
    asked = rules.context_window(req.context_window, req.named("context_window"))
    if asked is not None and (window is None or asked < window):  # the request's own, smaller
        param = req.named("context_window")
        max_tokens = rules.fit_window(len(prompt), max_tokens, asked, param, f"`{param}`")
    strict = args_check(grammars, req)  # first: a 400 names the strict tool at fault
    thinking = None
    if req.kind == "chat":
        enabled = (req.chat_template_kwargs or {}).get("enable_thinking") is not False
        thinking = _thinking(tokenizer, fmt, prompt, grammars, enabled, max_tokens,
                             rules.think_budget(req.think_budget))
    return Prompt(prompt, max_tokens, constraint(grammars, fmt, req, thinking), strict, applied)


def _thinking(tokenizer: Any, fmt: tool_calls.ToolFormat | None, prompt: list[int],
              grammars: Grammars | None, enabled: bool, max_tokens: int,
              budget: int | None) -> Thinking | None:
    """The reasoning a constrained answer may start with, by the model's markers: single
    tokens (found by id), several tokens (as Lark), or harmony's analysis channel."""
    markers = think_markers(tokenizer)
    if markers is not None:
        return Thinking.of(markers, opens_thinking(prompt, markers), enabled, max_tokens,
                           budget)
    if grammars is None:
        return None
    lit = lambda s: grammars.literal(s, "tools")  # noqa: E731
    own = fmt.thinking(lit) if fmt is not None else None
    if own is not None:  # harmony's analysis channel: gpt-oss always reasons
        return Thinking.of(own, False, True, max_tokens, budget)
    text = formats.text_thinking(tokenizer)
    if text is None:
        return None
    start, end = (lit(t) for t in text)
    return Thinking.of((start, end), formats.opens(tokenizer, prompt, text), enabled,
                       max_tokens, budget)


def args_check(grammars: Grammars | None, req: m.Generate) -> ArgsCheck | None:
    """The strict tools' parameters, compiled whole (else RequestError naming them), with the
    instance's grammar bounds: a call to one is checked against them once parsed."""
    if not req.strict_tools or not req.tools or req.tool_choice == "none":
        return None
    if grammars is None:
        raise RequestError("`strict` tools need the grammar engine, which this engine lacks",
                           "tools")
    return ArgsCheck(req.tools, req.strict_tools, grammars.limits, req.named)


def constraint(grammars: Grammars | None, fmt: tool_calls.ToolFormat | None,
               req: m.Generate, thinking: Thinking | None = None) -> Constraint | None:
    """The grammar a request's output must follow: a forced tool call, or its response_format,
    after the reasoning `thinking` allows (a thinking model)."""
    forced = req.tool_choice in ("required", "function") and req.tools
    if not forced and req.response_format is None:
        return None
    if grammars is None:
        raise RequestError("constrained decoding is not available on this engine",
                           "tool_choice" if forced else req.named("response_format"))
    if thinking is not None and not _apart(grammars, thinking):
        thinking = None  # markers the engine reads as text: it could not keep them apart
    literal = lambda s: grammars.literal(s, "tools")  # noqa: E731
    if forced:
        assert fmt is not None  # tool_calls.check refused tools on a model without a format
        allowed = formats.allowed(req)
        grammar = fmt.grammar(allowed, literal, "start") if thinking is None \
            else thinking.before(fmt.grammar(allowed, literal, "answer"))
        return grammars.compile(grammar, "tools")
    assert req.response_format is not None
    # harmony answers in its final channel: the JSON follows the channel's header.
    before = fmt.answer(literal) if fmt is not None else None
    return grammars.json_schema(req.response_format, thinking, req.named, before)


def _apart(grammars: Grammars, thinking: Thinking) -> bool:
    """The end marker starts with a token the engine keeps apart from text (a special one)."""
    if isinstance(thinking.start, int) and isinstance(thinking.end, int):
        return grammars.special(thinking.start, thinking.end)
    return str(thinking.end).startswith("<[")


def check_request(tokenizer: Any, req: m.Generate, vocab: int, window: int | None,
                  read: Prompt | None = None, grammars: Grammars | None = None,
                  batched: bool = False) -> Checked:
    """Everything of a request that reaches mlx, checked against the model as loaded:
    RequestError (naming the field) for what it cannot take. The same on every rank. `read`:
    its prompt, when already read (elsewhere: exod.runner.serving.reading). `batched`: for the
    batch engine, whose sampler applies a grammar (`grammar`: exod.runner.serving.batch_sampler)
    unless the request wants logprobs, which are then over what the grammar allows, as a
    logits processor makes them."""
    if read is None:
        read = read_prompt(tokenizer, req, vocab, window, grammars)
    processors = bias_processors(req.logit_bias, vocab) + penalty_processors(req)
    logprobs = rules.logprobs(req.logprobs)
    top = rules.top_logprobs(req.top_logprobs or None, logprobs)
    markers = think_markers(tokenizer) if req.kind == "chat" else None
    opened = opens_thinking(read.tokens, markers)
    budget = rules.think_budget(req.think_budget)
    # Last, as the grammar is: nothing after either may allow a token it forbids. A grammar
    # bounds the reasoning itself (exod.runner.serving.think_grammar).
    grammar = read.constraint if batched and not logprobs else None
    if read.constraint is not None and grammar is None:
        processors.append(read.constraint)
    elif budget is not None and markers is not None:
        processors.append(ThinkBudget(markers, opened, budget))
    return Checked(read.tokens, read.max_tokens, processors, make_request_sampler(req, vocab),
                   top_logprobs=top if logprobs else None, markers=markers,
                   thinking=opened, args_check=read.args_check, grammar=grammar)


def vocab_size(model: Any, tokenizer: Any) -> int:
    """Rows of the logits: the model's vocabulary (the tokenizer's may be smaller)."""
    n = model_checks.model_vocab(model)
    return n if n is not None else len(tokenizer)


def bias_processors(bias: dict[str, float], vocab: int) -> list[Processor]:
    """logit_bias as a logits processor. Ids are checked here too, not only by the API: an
    out-of-range index in `logits.at[...]` writes outside the array. The processor checks
    them again against the real width of the logits at its first call."""
    ids = rules.logit_bias(bias)
    if not ids:
        return []
    rules.bias_ids(list(ids), vocab)
    return [stateless(model_checks.bias_processor(ids))]
