"""The parts of the format models (tests.models.formats) that are plain logic: how a family's
output is cut into tokens, how tokens are added to a vocabulary, the decision lists a steered
model follows, and its hand-set network, run in numpy on toy rules. The models themselves, made
from the real templates and run by mlx, are checked in tests/integration/test_format_models.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.models.families import FAMILIES
from tests.models.format_rules import (
    MAX_BACK,
    Gate,
    Position,
    RuleConflict,
    check,
    compile_rules,
    defaults,
    positions,
)
from tests.models.format_vocab import add_tokens, as_vocab_key, split_pieces
from tests.models.format_weights import Layout, back_score_gap, forward, weights


def test_pieces_keep_tokens_and_markers_whole_and_newlines_apart() -> None:
    text = ('<think>\nWhy.\n</think>\n\n<tool_call>\n{"name": "Bash", "arguments": '
            '{"command": "echo exod-tool-ran"}}\n</tool_call><|im_end|>')
    pieces = split_pieces(text, ["<think>", "</think>", "<tool_call>", "</tool_call>",
                                 "<|im_end|>"], ["exod-tool-ran", '"name": "Bash"'])
    assert "".join(pieces) == text
    assert pieces == ["<think>", "\n", "Why.", "\n", "</think>", "\n\n", "<tool_call>", "\n",
                      "{", '"name": "Bash"', ', "arguments": {"command": "echo ',
                      "exod-tool-ran", '"}}', "\n", "</tool_call>", "<|im_end|>"]


def _toy_tokenizer() -> dict[str, object]:
    vocab = {"<s>": 0, "a": 1, "b": 2, "c": 3, "ab": 4, "abc": 5, "Ġb": 6}
    return {"added_tokens": [{"id": 0, "content": "<s>", "special": True}],
            "model": {"vocab": vocab, "merges": [["a", "b"], ["ab", "c"], ["Ġ", "b"]]}}


def test_added_tokens_take_the_last_merges_ids_in_order() -> None:
    tok = _toy_tokenizer()
    ids = add_tokens(tok, {"<x>": True, "y z": False, "<s>": True})
    assert ids == {"<x>": 5, "y z": 6, "<s>": 0}  # the two last merges' ids, ascending
    model = tok["model"]
    assert isinstance(model, dict) and model["merges"] == [["a", "b"]]
    added = tok["added_tokens"]
    assert isinstance(added, list)
    assert [(t["id"], t["content"], t["special"]) for t in added] == [
        (0, "<s>", True), (5, "<x>", True), (6, "y z", False)]
    assert len(model["vocab"]) + len(added) - 1 == 7  # the vocabulary keeps its size


def test_vocab_keys_are_byte_level() -> None:
    assert as_vocab_key("a b\n") == "aĠbĊ"
    assert as_vocab_key("<|x|>") == "<|x|>"


# Token ids for the toy models below.
TRIGGER, RESULT, BASH, EXEC, ECHO = 10, 11, 12, 13, 14
END_TURN, START, CHANNEL, MESSAGE, END = 2, 20, 21, 22, 23
ANALYSIS, FINAL, REASON, CALL, ANSWER, ASSISTANT = 30, 31, 32, 33, 34, 35


def _harmony_like() -> list[tuple[Gate, tuple[int, ...], tuple[int, ...]]]:
    """(gate, the prompt's fixed tail, the chain): chains that repeat tokens, as harmony's."""
    tail = (END, START, ASSISTANT)
    reason = (CHANNEL, ANALYSIS, MESSAGE, REASON, END, START, ASSISTANT)
    return [
        (Gate("call:claude-code"), tail, (*reason, CHANNEL, CALL, MESSAGE, CALL + 10, END_TURN)),
        (Gate("after"), tail, (*reason, CHANNEL, FINAL, MESSAGE, ANSWER, END_TURN)),
        (Gate("plain"), tail, (CHANNEL, FINAL, MESSAGE, ANSWER + 1, END_TURN)),
    ]


def _positions() -> list[Position]:
    out: list[Position] = []
    for gate, tail, chain in _harmony_like():
        out += positions([gate] * len(chain), tail, chain)
    return out


def test_decision_lists_write_every_chain_with_short_keys() -> None:
    ps = _positions()
    rules = compile_rules(ps)
    check(rules, ps)
    assert max(len(r.context) for r in rules) <= MAX_BACK + 1
    # The second <|channel|> of a reasoning chain needs the reasoning 4 tokens back.
    assert any(len(r.context) == 5 and r.context[0] == REASON for r in rules)
    assert sum(len(r.context) == 1 for r in rules) > len(rules) / 2


def test_a_context_that_must_write_two_tokens_is_refused() -> None:
    gate = Gate("plain")
    ps = positions([gate] * 2, (1,), (5, 6)) + positions([gate] * 2, (1,), (5, 7))
    with pytest.raises(RuleConflict):
        compile_rules(ps)


def test_previous_token_heads_stay_sharp_over_the_whole_context() -> None:
    for back in range(1, MAX_BACK + 1):
        assert back_score_gap(back) > 55


def _toy_model() -> dict[str, np.ndarray]:
    ps = _positions()
    markers = {"T": [TRIGGER], "R": [RESULT], "M:claude-code": [BASH], "M:codex": [EXEC],
               "M:library": [ECHO]}
    layout = Layout(64, markers, ("claude-code", "codex", "library"), compile_rules(ps),
                    defaults(ps))
    return weights(layout)


@pytest.mark.parametrize(("prompt", "kind"), [
    ((1, 3, TRIGGER, 4, BASH, 5), "call:claude-code"),
    ((1, BASH, 7, TRIGGER, 8, RESULT, 9), "after"),
    ((1, BASH, 6, 7), "plain"),  # the tool, no trigger
    ((1, TRIGGER, 6), "plain"),  # the trigger, no tool
])
def test_the_toy_model_writes_its_chain_by_far(prompt: tuple[int, ...], kind: str) -> None:
    w = _toy_model()
    gate, tail, chain = next(c for c in _harmony_like() if c[0].kind == kind)
    tokens = [*prompt, *tail, *chain[:-1]]
    logits = forward(w, tokens, queries=len(chain))
    for row, want in zip(logits, chain, strict=True):
        assert int(np.argmax(row)) == want
        assert row[want] - np.max(np.delete(row, want)) > 50


def test_a_prompt_ending_otherwise_starts_the_gates_first_token() -> None:
    w = _toy_model()
    logits = forward(w, [1, TRIGGER, BASH, 40, 41], queries=1)
    assert int(np.argmax(logits[0])) == CHANNEL


def test_the_family_table_is_consistent() -> None:
    for name, family in FAMILIES.items():
        assert family.name == name
        assert len(set(family.tokens)) == len(family.tokens), name
        assert family.result_marker and family.tool_marker.format("X") != family.tool_marker
        json.dumps(family.modes)  # template arguments, as a client would send them
