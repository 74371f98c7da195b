"""The grammar engine's slices (exod.runner.serving.grammar.SLICES) change how fast a mask is
computed, never what it is: along random walks of allowed tokens on the demo model's tokenizer
(49k tokens), every mask equals the one llguidance's own slices give, for the schemas of
bench.agent_constrained (a string array with maxLength, nested objects, a pydantic model, a long
string, json_object). It imports mlx: run in a pytest process of its own by
test_grammar_slices.py (tests/own_process.py), the demo model named by EXOD_TEST_DEMO."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import llguidance
import numpy as np
import pytest

from bench.agent_constrained import cases
from exod.wire.options import GrammarLimits
from exod.runner.serving import grammar

STEPS, WALKS = 48, 3


@pytest.fixture(scope="module")
def both() -> tuple[grammar.Grammars, grammar.Grammars]:
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    demo_model = Path(os.environ["EXOD_TEST_DEMO"])
    tok = load_tokenizer(demo_model)
    vocab = json.loads((demo_model / "config.json").read_text())["vocab_size"]
    ours = grammar.Grammars(tok, vocab, GrammarLimits())
    theirs = grammar.Grammars(tok, vocab, GrammarLimits())
    theirs._ll = ours.ll_tokenizer("x").with_slices(llguidance.LLTokenizer.general_slices())
    return ours, theirs


def formats() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for case in cases():
        fmt = case.side.get("response_format")
        if fmt is not None:
            out.append((case.name, {**fmt, "schema": fmt.get("json_schema", {}).get("schema")}))
    return out


def walk(g: grammar.Grammars, fmt: dict[str, Any], seed: int, vocab: int) -> list[np.ndarray]:
    rng = random.Random(seed)
    c = g.json_schema(fmt)
    masks = [c.words.copy()]
    for _ in range(STEPS):
        bits = np.unpackbits(c.words.view(np.uint8), bitorder="little")[:vocab]
        allowed = np.flatnonzero(bits)
        if allowed.size == 0 or not c.advance(int(rng.choice(allowed))):
            break
        c.matcher.unsafe_compute_mask_ptr(c.words.ctypes.data, c.words.nbytes)
        masks.append(c.words.copy())
    return masks


@pytest.mark.parametrize("name,fmt", formats(), ids=[n for n, _ in formats()])
def test_our_slices_give_llguidances_masks(both: tuple[grammar.Grammars, grammar.Grammars],
                                            name: str, fmt: dict[str, Any]) -> None:
    ours, theirs = both
    assert grammar.SLICES != llguidance.LLTokenizer.general_slices()  # two ways, compared
    compared, seed = 0, 0
    while compared < WALKS * STEPS and seed < 20:  # a walk may end early (a closed object)
        a, b = walk(ours, fmt, seed, ours.vocab), walk(theirs, fmt, seed, theirs.vocab)
        assert len(a) == len(b), (name, seed, len(a), len(b))
        for step, (x, y) in enumerate(zip(a, b, strict=True)):
            assert np.array_equal(x, y), (name, seed, step)
        compared, seed = compared + len(a), seed + 1
    assert compared >= WALKS * STEPS, (name, compared)
