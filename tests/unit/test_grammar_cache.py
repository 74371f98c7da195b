"""Compiled grammars kept and copied (exod.runner.serving.grammar.Grammars): a request whose
grammar was compiled before gets a copy that shares the lexer but not the parse, so two
requests on one schema each follow their own tokens; the cache keeps CACHED grammars; a
grammar the engine refuses is refused again, never kept. A tokenizer of the 256 bytes and an
end token stands in for a model's (the engine reads any Hugging Face fast tokenizer)."""

from __future__ import annotations

import types
from typing import Any

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from exod.wire.options import GrammarLimits
from exod.core.request_rules import RequestError
from exod.runner.serving import grammar
from exod.runner.serving.grammar import Constraint, Grammars

SCHEMA = {"type": "json_schema", "schema": {"type": "object", "properties": {
    "a": {"type": "integer"}, "b": {"type": "boolean"}}, "required": ["a", "b"]}}


@pytest.fixture(scope="module")
def grammars() -> Grammars:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(['{"a":1,"b":true}'], trainers.BpeTrainer(
        vocab_size=300, special_tokens=[AddedToken("</s>", special=True)],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    eos = tok.token_to_id("</s>")

    def encode(text: str, add_special_tokens: bool = True) -> list[int]:
        return list(tok.encode(text, add_special_tokens=add_special_tokens).ids)

    wrapper: Any = types.SimpleNamespace(_tokenizer=types.SimpleNamespace(backend_tokenizer=tok),
                                         eos_token_ids=[eos], encode=encode)
    return Grammars(wrapper, tok.get_vocab_size(), GrammarLimits())


def write(c: Constraint, text: str, g: Grammars) -> bool:
    """Feed `text`'s tokens to the constraint's matcher as the model would, each one allowed
    by the mask before it."""
    for t in g.tokenizer.encode(text, add_special_tokens=False):
        if not (c.words[t >> 5] >> (t & 31)) & 1:
            return False
        if not c.matcher.consume_token(t):
            return False
        c._fill()
    return True


def test_two_requests_on_one_schema_each_follow_their_own_tokens(grammars: Grammars) -> None:
    first = grammars.json_schema(SCHEMA)
    assert write(first, '{"a":12', grammars)
    second = grammars.json_schema(SCHEMA)  # a copy of the compiled grammar, made fresh
    assert second.matcher is not first.matcher
    assert write(second, '{"a":3,"b":true}', grammars) and second.matcher.is_accepting()
    assert write(first, ',"b":false}', grammars) and first.matcher.is_accepting()
    assert not write(grammars.json_schema(SCHEMA), '{"b":true', grammars)  # a new one starts anew


def test_the_cache_keeps_the_last_grammars_used(grammars: Grammars,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grammar, "CACHED", 2)
    formats = [{"type": "json_schema", "schema": {"type": "integer", "maximum": n}}
               for n in range(3)]
    for fmt in formats:
        grammars.json_schema(fmt)
    assert len(grammars._compiled) == 2
    c = grammars.json_schema(formats[0])  # compiled again: it had gone
    assert write(c, "0", grammars) and not write(grammars.json_schema(formats[0]), "1", grammars)


def test_a_grammar_the_engine_refuses_is_refused_every_time(grammars: Grammars) -> None:
    bad = {"type": "json_schema", "schema": {"type": "string", "pattern": "(?=a)b"},
           "strict": True}
    for _ in range(2):
        with pytest.raises(RequestError) as e:
            grammars.json_schema(bad)
        assert e.value.param == "response_format.json_schema.schema"


@pytest.mark.parametrize("extra", [0, 3, -2])
def test_the_mask_leaves_allowed_logits_and_rules_out_the_rest(grammars: Grammars,
                                                               extra: int) -> None:
    """Logits wider than the vocabulary (padding rows) are never allowed; narrower ones are
    masked as far as they go."""
    import mlx.core as mx
    import numpy as np

    c = grammars.json_schema(SCHEMA)
    allowed = [t for t in range(grammars.vocab) if (c.words[t >> 5] >> (t & 31)) & 1]
    assert 0 < len(allowed) < 5  # the JSON's first token: only a few of the vocabulary
    width = grammars.vocab + extra
    out = np.array(c(mx.array([0]), mx.arange(width, dtype=mx.float32)[None]))[0]
    kept = [t for t in allowed if t < width]
    assert out.shape == (width,) and out[kept].tolist() == kept
    assert np.isneginf(np.delete(out, kept)).all()
