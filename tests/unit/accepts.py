"""Whether a grammar (Lark text, or llguidance's JSON form) accepts a text whole: the grammar
engine reads it one byte per token (exod.runner.serving.strict_args' byte tokenizer), so what
is checked is the text, whatever a model's tokenizer would make of it."""

from __future__ import annotations

import llguidance

from exod.runner.serving.strict_args import byte_tokenizer


def accepts(grammar: str, text: str) -> bool:
    matcher = llguidance.LLMatcher(byte_tokenizer(), grammar, log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    return matcher.consume_tokens(list(text.encode("utf-8"))) and matcher.is_accepting()
