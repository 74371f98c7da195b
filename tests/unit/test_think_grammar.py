"""Reasoning before a constrained answer (exod.runner.serving.think_grammar): when a think block
comes first, how long it may be, and that the grammar it makes is one llguidance takes."""

from __future__ import annotations

import llguidance
import pytest

from exod.runner.serving.json_bounds import json_rule
from exod.runner.serving.think_grammar import Thinking
from tests.unit.accepts import accepts

ANSWER = 'answer: %json {"type": "object"}\n'


def test_no_markers_or_thinking_off_means_no_block() -> None:
    assert Thinking.of(None, opened=True, enabled=True, max_tokens=100) is None
    assert Thinking.of((5, 6), opened=False, enabled=False, max_tokens=100) is None


def test_a_block_the_template_opened_is_thought_in_even_with_thinking_off() -> None:
    # enable_thinking false with the block left open: a template that ignores the flag.
    assert Thinking.of((5, 6), opened=True, enabled=False, max_tokens=100) == \
        Thinking(5, 6, True, 50)


@pytest.mark.parametrize("max_tokens, budget", [(1, 1), (2, 1), (401, 200)])
def test_the_reasoning_gets_half_of_max_tokens(max_tokens: int, budget: int) -> None:
    thinking = Thinking.of((5, 6), opened=False, enabled=True, max_tokens=max_tokens)
    assert thinking is not None and thinking.budget == budget


def test_a_think_budget_replaces_half_of_max_tokens() -> None:
    thinking = Thinking.of((5, 6), opened=True, enabled=True, max_tokens=400, budget=8)
    assert thinking is not None and thinking.budget == 8


def test_an_opened_block_must_close_and_another_may_open() -> None:
    opened = Thinking(5, 6, True, 7).before(ANSWER)
    assert opened.splitlines()[0] == "start: thought <[6]> answer"
    optional = Thinking(5, 6, False, 7).before(ANSWER)
    assert optional.splitlines()[0] == "start: (<[5]> thought <[6]>)? answer"
    for grammar in (opened, optional):
        assert "thought[max_tokens=7]: /(.|\\n)*/" in grammar and grammar.endswith(ANSWER)
        assert llguidance.LLMatcher.validate_grammar(grammar) == ""


def test_the_answer_after_the_reasoning_is_bounded_compact_json() -> None:
    """The answer's rules are made where every JSON grammar is (exod.runner.serving.
    json_bounds): after the block, the same bounds as without one."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    grammar = Thinking(5, 6, False, 7).before(f"answer: {json_rule(schema, strict=False)}\n")
    assert accepts(grammar, '{"n":1}')
    for bad in ('{"n": 1}', '{"n":1,"m":2}', '{"n":' + "1" * 17 + "}"):
        assert not accepts(grammar, bad), bad
