"""Constrained decoding: a request's grammar (a JSON schema, or a forced tool call) compiled by
llguidance and applied to that sequence alone, so a batch mixes free and constrained requests.
Why llguidance: docs/tools.md, "Why llguidance". The JSON a grammar allows is bounded where the
client's schema sets no end (exod.runner.serving.json_bounds makes every JSON part of it).

A grammar is compiled, and its first mask computed (where llguidance builds its lexer), where a
request is read (exod.runner.serving.reading), off the serve loop's thread: the serve loop only
ever computes the mask of one more token. Compiled grammars are kept (CACHED, least recently
used out), since agents send the same schema or tool set on every turn: a request whose grammar
was seen before gets a copy instead of a compile. The copies share the lexer, which llguidance
builds a state at a time, so a warm one masks for less; its errors are shared too: a copy that
runs past the step fuel or max_lexer_states ends the copies beside it, and the grammar is
compiled afresh for the next request. Every rank of a group compiles the same grammar, and the
mask is a function of the tokens: the same token is chosen on every rank. What each part costs:
docs/tools.md, "Constrained decoding"; docs/design/constrained-decoding.md.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import llguidance
import mlx.core as mx
import numpy as np

from exod.wire.options import GrammarLimits
from exod.runner.link.log import WARNING, log
from exod.core.request_rules import RequestError
from exod.runner.serving import json_bounds
from exod.runner.serving.think_grammar import Thinking
from exod.core.text import clip

MAX_ERROR = 300  # characters of the engine's message in a 400
CACHED = 16  # compiled grammars kept, each with its lexer
# Copies made of one compiled grammar before it is compiled afresh: its shared lexer only grows
# (bounded by the instance's max_lexer_states, past which the request in flight would fail).
COPIES = 256


# The token sets llguidance's mask computation takes whole where a lexer state allows all of
# them, rather than walking the token trie (its "slices"). Its default cuts string characters
# at 10 and 30: inside a string with a maxLength, fewer characters left than 10 walk every
# token, many times a plain string's mask. Cut at 1, 2, 4, 8, 10, 16 and 30, the sets of short
# tokens stay whole down to the last characters, with the same masks, every bit
# (tests/integration/slices_checks.py; what it saves: docs/design/constrained-decoding.md).
# Slices only speed the masks up: llguidance checks that a state allows a whole set before
# taking it.
_CHAR = r'[^"\\\x00-\x1F\x7F]'  # a JSON string's character, unescaped (llguidance's class)
SLICES = [r"[\x20\x0A\x0D\x09]+", *(f"{_CHAR}{{1,{n}}}" for n in (1, 2, 4, 8, 10, 16, 30)),
          f"{_CHAR}+"]


class Grammars:
    """Compiles grammars for one model's tokenizer. llguidance's view of the tokenizer, slow to
    build (docs/design/constrained-decoding.md), is built once, at the first constrained
    request."""

    def __init__(self, tokenizer: Any, vocab: int, limits: GrammarLimits) -> None:
        self.tokenizer, self.vocab = tokenizer, vocab
        self.limits = limits
        self._lock = threading.Lock()
        self._ll: llguidance.LLTokenizer | None = None
        self._compiled: OrderedDict[str, _Compiled] = OrderedDict()

    def ll_tokenizer(self, param: str) -> llguidance.LLTokenizer:
        with self._lock:
            if self._ll is None:
                backend = getattr(getattr(self.tokenizer, "_tokenizer", None),
                                  "backend_tokenizer", None)
                if backend is None:
                    raise RequestError(f"`{param}`: this model's tokenizer is not one the "
                                       "grammar engine reads (a Hugging Face fast tokenizer)",
                                       param)
                eos = sorted(int(t) for t in self.tokenizer.eos_token_ids)
                self._ll = llguidance.LLTokenizer(backend.to_str(), n_vocab=self.vocab,
                                                  eos_token=eos, slices=SLICES)
            return self._ll

    def special(self, *ids: int) -> bool:
        """Whether each token is special for the engine (added tokens are: never text)."""
        ll = self.ll_tokenizer("response_format")
        return all(0 <= i < self.vocab and ll.is_special_token(i) for i in ids)

    def literal(self, text: str, param: str) -> str:
        """`text` in a Lark grammar: its special tokens as themselves (`<[id]>`), the text
        between them quoted (a marker may be both: `<|channel>thought`)."""
        ll = self.ll_tokenizer(param)
        parts: list[str] = []
        at = 0
        for t in (int(i) for i in self.tokenizer.encode(text, add_special_tokens=False)):
            if not (0 <= t < self.vocab and ll.is_special_token(t)):
                continue
            token = self.tokenizer.convert_ids_to_tokens(t)
            found = text.find(token, at) if isinstance(token, str) and token else -1
            if found < 0:  # a token that is not its own text: the marker as text
                return json.dumps(text)
            if found > at:
                parts.append(json.dumps(text[at:found]))
            parts.append(f"<[{t}]>")
            at = found + len(token)
        if at < len(text):
            parts.append(json.dumps(text[at:]))
        return " ".join(parts)

    def json_schema(self, fmt: dict[str, Any], thinking: Thinking | None = None,
                    named: Callable[[str], str] = str, before: str | None = None
                    ) -> Constraint:
        """response_format: json_object (any object) or json_schema, bounded (exod.runner.
        serving.json_bounds). A strict schema must be enforceable whole; else keywords the
        engine does not implement are left out. `thinking`: the answer may be preceded by
        reasoning (see Thinking). `named`: a field as the client spelled it. `before`: what
        the model writes before its answer (Lark: harmony's final channel)."""
        param = named("response_format")
        if fmt["type"] == "json_object":
            schema: Any = json_bounds.JSON_OBJECT
        else:
            schema, param = fmt["schema"], named("response_format.json_schema.schema")
        strict = bool(fmt.get("strict", False))
        if thinking is not None or before is not None:  # the same schema, after those
            answer = f"answer: {before or ''} {json_bounds.json_rule(schema, strict)}\n"
            if thinking is None:
                return self.compile(answer.replace("answer:", "start:", 1), param)
            return self.compile(thinking.before(answer), param)
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(
                json.dumps(json_bounds.bounded(schema)), overrides=json_bounds.options(strict))
        except ValueError as e:
            raise RequestError(f"`{param}`: {_clip(str(e))}", param) from None
        return self.compile(grammar, param)

    def compile(self, grammar: str, param: str) -> Constraint:
        """A matcher for `grammar` with its first mask, or RequestError naming `param`. A
        grammar compiled before is copied (its lexer shared), not compiled again."""
        with self._lock:
            kept = self._compiled.get(grammar)
            if kept is not None and (kept.copies >= COPIES or kept.matcher.is_error()):
                del self._compiled[grammar]
                kept = None
            if kept is not None:
                self._compiled.move_to_end(grammar)
                kept.copies += 1
                matcher = kept.matcher.deep_copy()
        if kept is None:
            matcher = self._matcher(grammar, param)
            with self._lock:
                self._compiled[grammar] = _Compiled(matcher.deep_copy())
                while len(self._compiled) > CACHED:
                    self._compiled.popitem(last=False)
        eos = sorted(int(t) for t in self.tokenizer.eos_token_ids)
        constraint = Constraint(matcher, self.vocab, eos)
        if matcher.is_error():
            raise RequestError(f"`{param}`: the grammar engine cannot take it: "
                               f"{_clip(matcher.get_error())}", param)
        return constraint

    def _matcher(self, grammar: str, param: str) -> llguidance.LLMatcher:
        limits = llguidance.LLParserLimits(
            max_grammar_size=self.limits.max_size, max_lexer_states=self.limits.max_lexer_states,
            initial_lexer_fuel=self.limits.compile_fuel, step_lexer_fuel=self.limits.step_fuel,
            verbose_errors=False)
        try:
            matcher = llguidance.LLMatcher(self.ll_tokenizer(param), grammar, log_level=0,
                                           limits=limits)
        except Exception as e:  # noqa: BLE001 -- a panic in the engine (e.g. a grammar too big)
            raise RequestError(f"`{param}`: the grammar engine cannot take it: "
                               f"{_clip(str(e))}", param) from None
        if matcher.is_error():
            raise RequestError(f"`{param}`: the grammar engine cannot take it: "
                               f"{_clip(matcher.get_error())}", param)
        return matcher


class _Compiled:
    """A compiled grammar, kept fresh (never advanced): each request gets a copy."""

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self.matcher = matcher
        self.copies = 0


class Constraint:
    """One sequence's grammar: every token outside it gets -inf. In the batch engine its mask
    is added by the batch's sampler (exod.runner.serving.batch_sampler: the masks of a step's
    rows computed at once); else it is a logits processor, called once per generated token with
    the tokens so far, whose last one is the token just chosen (nothing is consumed at the first
    call, whose last token is the prompt's)."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab: int, eos: list[int]) -> None:
        self.matcher, self.vocab = matcher, vocab
        self.eos = [t for t in eos if 0 <= t < vocab]
        self.words = np.zeros((vocab + 31) // 32, dtype=np.uint32)
        self.bias = np.zeros(vocab, dtype=np.float32)
        self._stale = False  # words newer than bias
        self._retired = False
        self._started = False
        self._broken = False
        self._fill()  # the first mask, built here: this is where the lexer is built

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        if self._started:
            # The mask needs the token just chosen: start the forward first, then read it.
            mx.async_eval(logits)
            last: Any = tokens.reshape(-1)[-1].item()
            if self.advance(int(last)):
                self._fill()
        self._started = True
        return logits + self.row(logits)

    def row(self, logits: mx.array) -> mx.array:
        """The mask, as a row to add to `logits`."""
        mask = mx.array(self.padded(logits.shape[-1]))
        return mask if logits.dtype == mx.float32 else mask.astype(logits.dtype)

    def padded(self, width: int) -> np.ndarray:
        """The mask as a row of `width` to add: logits wider than the tokenizer are padding
        rows, never allowed."""
        if self._stale:
            self._unpack()
        if width == self.vocab:
            return self.bias
        return np.concatenate([self.bias, np.full(max(0, width - self.vocab), -np.inf,
                                                  np.float32)])[:width]

    def retire(self) -> None:
        """Its request ended: a token its sampler chose after the last one shown is not
        consumed (it would be past the end of the grammar)."""
        self._retired = True

    def advance(self, token: int) -> bool:
        """Consume the token chosen; False when no mask is left to compute (broken, ended)."""
        if self._broken or self._retired or self.matcher.is_stopped():
            return False
        if not self.matcher.consume_token(token):
            self._fail()
            return False
        return True

    def filled(self, words: np.ndarray) -> None:
        """The next mask, computed elsewhere (MaskRound, which applies the words themselves:
        the row to add is made only if a processor asks for it)."""
        self.words[:] = words
        if self.matcher.is_error():
            self._fail()
        else:
            self._stale = True

    def _unpack(self) -> None:
        """The mask as a row added to the logits: 0 where allowed, -inf elsewhere (an addition
        costs the CPU an eighth of what `mx.where` did). For the processor path and a broken
        matcher; the batch's sampler makes its rows from the words (MaskRound). llguidance
        leaves a bit per token, 32 to a word, little-endian."""
        allowed = np.unpackbits(self.words.view(np.uint8), bitorder="little")[:self.vocab]
        self.bias = np.where(allowed.view(np.bool_), np.float32(0), np.float32(-np.inf))
        self._stale = False

    @property
    def error(self) -> str | None:
        return self.matcher.get_error() if self.matcher.is_error() else None

    def _fill(self) -> None:
        if self._broken:
            return
        self.matcher.unsafe_compute_mask_ptr(self.words.ctypes.data, self.words.nbytes)
        if self.matcher.is_error():
            self._fail()
        else:
            self._unpack()

    def _fail(self) -> None:
        """The matcher broke (a step past its fuel): only end-of-sequence is left. Logged once."""
        if not self._broken:
            self._broken = True
            log(f"constrained decoding stopped: {_clip(self.matcher.get_error())}", WARNING)
        self.words[:] = 0
        for t in self.eos:
            self.words[t >> 5] |= np.uint32(1 << (t & 31))
        self._unpack()


def _clip(text: str) -> str:
    return clip(text, MAX_ERROR, flat=True)
