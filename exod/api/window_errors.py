"""A prompt with no room left in the context window, in the words each dialect's clients
recognise (exod.api.errors.runner_error makes them the 400 it answers).

Agents act on this error by its words or its code, not by its status: Claude Code compacts
(or says the conversation cannot be) on Anthropic's `prompt is too long: N tokens > M
maximum`, matched by a regular expression that reads both numbers; Codex says "ran out of room
in the model's context window" on OpenAI's `code: context_length_exceeded`; OpenAI's own
wording for chat ("maximum context length") and for Responses ("exceeds the context window")
is what other clients look for; Ollama's clients see its own text, "the input length exceeds
the context length". Any other 400 is shown raw, and an agent retries it or gives up.

The runner refuses such a prompt (exod.core.request_rules.fit_window) and sends the refusal
with its numbers (exod.wire.messages' `Error`, code `context_length_exceeded`): `from_runner`
words them.
"""

from __future__ import annotations

from dataclasses import dataclass

from exod.wire import messages as m

CODE = "context_length_exceeded"  # OpenAI's code for it, which Codex and others test


@dataclass(frozen=True)
class Words:
    """The error's message in OpenAI's shape (chat completions, completions, Responses: the
    `param` tells which), and in Anthropic's and Ollama's."""

    openai: str
    anthropic: str
    ollama: str


def from_runner(ev: m.Error) -> Words | None:
    """The words for the runner's refusal when it is a prompt past the window."""
    if ev.code != "context_length_exceeded" or ev.prompt_tokens is None or ev.window is None:
        return None
    return words(ev.prompt_tokens, ev.window, ev.own_window, ev.param)


def words(n: int, window: int, own: bool, param: str | None) -> Words:
    """The numbers are exact: `n` prompt tokens against a window that keeps one position for
    the answer, so the longest prompt it takes is `window - 1`; `param` is the field at fault
    (the prompt's, or `options.num_ctx` when the window was the request's own: `own`)."""
    if param == "input":  # Responses
        openai = (f"Your input exceeds the context window of this model: it is {n} tokens, "
                  f"and the window of {window} must keep one for the answer. Please adjust "
                  "your input and try again.")
    else:  # chat completions, completions
        what = "prompt" if param == "prompt" else "messages"
        openai = (f"This model's maximum context length is {window} tokens. However, your "
                  f"{what} resulted in {n} tokens, and the answer needs one more. Please "
                  f"reduce the length of the {what}.")
    if own:
        openai += f" (The window is the request's own `{param}`.)"
    limit = f"`{param}`" if own else "the model's context length"
    return Words(openai, f"prompt is too long: {n} tokens > {window - 1} maximum",
                 f"the input length exceeds the context length: {n} tokens, and {limit} of "
                 f"{window} keeps one for the answer")
